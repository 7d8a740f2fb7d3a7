"""``roder fsck``: check (and repair) the threads of a store that can (the JSONL store).

Works with any :class:`roder_api.storekit.RepairableThreadStore` through its public methods.
"""

from __future__ import annotations

import argparse
from typing import Any

from roder_api.errors import StoreError, ThreadNotFoundError
from roder_api.storekit import RepairableThreadStore
from roder_runtime._cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    add_command,
    add_json_flag,
    count,
    open_runtime,
    print_json,
    progress,
)


def register(subparsers: Any) -> None:
    """Add the ``fsck`` command."""
    parser = add_command(
        subparsers,
        "fsck",
        help="check the thread journals (and repair them)",
        description=(
            "Check every thread of the JSONL store: line framing and checksums, sequence "
            "numbers, and that the listing index agrees with the journals. Exits 1 when "
            "damage is left. --repair moves a damaged tail to a quarantine file next to its "
            "journal (it never deletes data); --reindex rebuilds the listing index."
        ),
        examples=("roder fsck", "roder fsck --repair", "roder fsck --reindex --json"),
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="move damaged tails to quarantine files and fix index rows",
    )
    parser.add_argument(
        "--reindex", action="store_true", help="rebuild the listing index from the journals"
    )
    add_json_flag(parser)
    parser.set_defaults(handler=fsck_command)


async def fsck_command(args: argparse.Namespace) -> int:
    """Check every thread; repair and reindex on request; exit 1 if damage is left."""
    async with open_runtime(args) as runtime:
        store = await runtime.store()
        if not isinstance(store, RepairableThreadStore):
            raise CommandError(
                f"roder fsck checks JSONL thread stores; the configured store "
                f"({runtime.thread_store_factory().describe()}) has no journals to check; "
                "use that backend's own tools"
            )
        thread_ids: list[str] = await store.journal_ids()
        reports: list[dict[str, Any]] = []
        damaged = repaired = 0
        quiet = bool(args.json)
        for thread_id in progress(thread_ids, desc="checking", quiet=quiet):
            try:
                check = await store.check_thread(thread_id)
            except ThreadNotFoundError:
                continue  # deleted while we looked
            report: dict[str, Any] = check.to_json()
            report["repair"] = None
            unrepaired: str | None = None
            status = "ok" if check.ok else "damaged"
            if not check.ok and args.repair:
                try:
                    repair = await store.repair_thread(thread_id)
                except StoreError as exc:
                    report["repair"] = {"error": str(exc)}
                else:
                    report["repair"] = repair.to_json()
                    unrepaired = repair.unrepaired_reason
                    if unrepaired is None:
                        after = (
                            None if repair.thread_removed else await store.check_thread(thread_id)
                        )
                        if after is None or after.ok:
                            status = "repaired"
            if status == "damaged" and not check.data_damaged and args.reindex:
                status = "reindexed"  # only the index disagreed; rebuilt below
            if status == "damaged":
                damaged += 1
            elif status == "repaired":
                repaired += 1
            report["status"] = status
            reports.append(report)
            if not quiet and status != "ok":
                line = f"{thread_id}: {check.describe()}"
                if status == "repaired":
                    moved = report["repair"]
                    where = f" -> {moved['quarantine']}" if moved.get("quarantine") else ""
                    line += f" [repaired{where}]"
                elif status == "reindexed":
                    line += " [reindexed]"
                elif unrepaired is not None:
                    line += f" [not repaired: {unrepaired}]"
                elif report["repair"] and report["repair"].get("error"):
                    line += f" [repair failed: {report['repair']['error']}]"
                print(line)
        indexed = None
        if args.reindex:
            indexed = 0
            for thread_id in progress(thread_ids, desc="reindexing", quiet=quiet):
                indexed += bool(await store.reindex_thread(thread_id))
            await store.prune_index()
    summary = {
        "checked": len(reports),
        "damaged": damaged,
        "repaired": repaired,
        "reindexed": indexed,
        "threads": reports,
    }
    if args.json:
        print_json(summary)
    else:
        text = f"checked {count(len(reports), 'thread')}: {damaged} damaged, {repaired} repaired"
        if indexed is not None:
            text += f"; index rebuilt ({indexed} threads)"
        if damaged and not args.repair:
            text += "; run `roder fsck --repair` to quarantine the damage"
        print(text)
    return EXIT_FAILURE if damaged else EXIT_OK
