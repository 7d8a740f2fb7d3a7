"""``roder fsck``: check (and repair) the threads of a store that can (the JSONL store).

The command parses, calls :func:`roder_runtime.threads.check_threads` (any
:class:`roder_api.storekit.RepairableThreadStore`, through its public methods) and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from roder_runtime import threads
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    add_command,
    add_json_flag,
    count,
    open_runtime,
    print_json,
    progress_callback,
)
from roder_runtime.threads._fsck_ops import ThreadCheck


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
    quiet = bool(args.json)
    async with open_runtime(args) as runtime:
        with progress_callback("checking", quiet=quiet) as on_progress:
            result = await threads.check_threads(
                runtime,
                repair=args.repair,
                reindex=args.reindex,
                on_progress=on_progress,
                on_thread=None if quiet else _print_damage,
            )
    damaged, repaired = result.count("damaged"), result.count("repaired")
    if args.json:
        print_json(
            {
                "checked": len(result.threads),
                "damaged": damaged,
                "repaired": repaired,
                "reindexed": result.reindexed,
                "threads": [t.to_json() for t in result.threads],
            }
        )
    else:
        text = f"checked {count(len(result.threads), 'thread')}: {damaged} damaged, "
        text += f"{repaired} repaired"
        if result.reindexed is not None:
            text += f"; index rebuilt ({result.reindexed} threads)"
        if damaged and not args.repair:
            text += "; run `roder fsck --repair` to quarantine the damage"
        print(text)
    return EXIT_FAILURE if damaged else EXIT_OK


def _print_damage(checked: ThreadCheck) -> None:
    """Print one line for a thread that was not ok, saying what was done about it."""
    if checked.status == "ok":
        return
    line = f"{checked.check.thread_id}: {checked.check.describe()}"
    if checked.status == "repaired":
        moved = checked.repair or {}
        where = f" -> {moved['quarantine']}" if moved.get("quarantine") else ""
        line += f" [repaired{where}]"
    elif checked.status == "reindexed":
        line += " [reindexed]"
    elif checked.unrepaired is not None:
        line += f" [not repaired: {checked.unrepaired}]"
    elif checked.repair and checked.repair.get("error"):
        line += f" [repair failed: {checked.repair['error']}]"
    print(line)
