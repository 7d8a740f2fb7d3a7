"""``roder threads delete|fork|prune``: the commands that change the store."""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roder_api.codec import dumps as codec_dumps
from roder_api.errors import SequenceConflictError, ThreadNotFoundError
from roder_api.threads import (
    ThreadMetadata,
    ThreadStore,
    validate_thread_id,
)
from roder_runtime._cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    confirm,
    count,
    format_ms,
    format_size,
    iso_ms,
    on_terminal,
    open_runtime,
    print_json,
    progress,
)
from roder_runtime._cli._ids import all_threads, resolve_thread_id
from roder_runtime._runtime import Runtime


def forked_from(meta: ThreadMetadata) -> Mapping[str, Any] | None:
    origin = meta.extra.get("forked_from") if isinstance(meta.extra, Mapping) else None
    return origin if isinstance(origin, Mapping) else None


# --- delete -------------------------------------------------------------------------------------


async def _existing(runtime: Runtime, thread_ids: Sequence[str]) -> list[ThreadMetadata]:
    """Return the metadata of every thread; fail naming all the missing ones."""
    found: list[ThreadMetadata] = []
    missing: list[str] = []
    for thread_id in progress(thread_ids, total=len(thread_ids), desc="checking"):
        try:
            found.append(await runtime.get_thread(await resolve_thread_id(runtime, thread_id)))
        except ThreadNotFoundError:
            missing.append(thread_id)
    if missing:
        raise CommandError(
            "not found: " + ", ".join(missing) + "; nothing was deleted (check the ids with "
            "`roder threads list`)"
        )
    return found


def _summary_line(meta: ThreadMetadata, size: int | None = None) -> str:
    parts = [meta.thread_id, format_ms(meta.updated_at_ms), f"{meta.item_count} items"]
    if size is not None:
        parts.append(format_size(size))
    if meta.title:
        parts.append(meta.title)
    return "  " + "  ".join(parts)


async def delete_command(args: argparse.Namespace) -> int:
    """Delete threads, asking first on a terminal unless ``--yes``."""
    thread_ids = list(dict.fromkeys(args.thread_ids))
    for thread_id in thread_ids:
        validate_thread_id(thread_id)
    if not args.yes and not on_terminal():
        raise CommandError(
            "refusing to delete without confirmation: not on a terminal; pass --yes", EXIT_USAGE
        )
    async with open_runtime(args) as runtime:
        metas = await _existing(runtime, thread_ids)
        if not args.yes:
            print(f"about to delete {len(metas)} thread(s):", file=sys.stderr)
            for meta in metas:
                print(_summary_line(meta), file=sys.stderr)
            if not await confirm("delete them?"):
                print("roder: nothing was deleted", file=sys.stderr)
                return EXIT_OK
        deleted: list[str] = []
        for meta in progress(metas, total=len(metas), desc="deleting", quiet=args.json):
            await runtime.delete_thread(meta.thread_id)
            deleted.append(meta.thread_id)
    if args.json:
        print_json({"deleted": deleted})
    else:
        for thread_id in deleted:
            print(f"deleted {thread_id}")
    return EXIT_OK


# --- fork ---------------------------------------------------------------------------------------


async def fork_thread(
    runtime: Runtime, source_id: str, *, at: int | None = None, title: str | None = None
) -> tuple[ThreadMetadata, int]:
    """Return a new thread holding ``source_id``'s events up to ``at``, and the count copied.

    The events are imported verbatim (same sequence numbers and times); the source is only
    read. The fork's ``extra`` is the source's plus ``forked_from`` ``{thread_id, sequence}``.

    Why ``import_events`` and not ``append_events(..., expected_last_sequence=0)``: a fork
    keeps the source's times (DESIGN.md, docs/concepts.md), and an append stamps new ones.
    The import is the conditional write here: events 1..N continue the fork's journal only
    while it is empty, and the store checks that and writes as one step (the same check
    and lock as a conditional append), raising ``SequenceConflictError`` and writing nothing
    otherwise. The read needs no condition: journals are append-only, so events 1..N of the
    source are final whatever is appended meanwhile. If someone else wrote to the new
    thread first, the fork is left as it is (their events were acknowledged) and the
    command says so; any other failure deletes the half-made fork.
    """
    store = await runtime.store()
    source = await store.get_thread(source_id)
    last = source.last_sequence
    sequence = last if at is None else at
    if sequence > last:
        raise CommandError(
            f"--at {sequence} is past the end of thread {source_id} (its last event is "
            f"{last}; see `roder threads show {source_id} --events`)",
            EXIT_USAGE,
        )
    entries = await store.read_events(source_id, limit=sequence) if sequence else []
    if [e.sequence for e in entries] != list(range(1, sequence + 1)):
        raise CommandError(
            f"thread {source_id}'s journal does not hold events 1..{sequence}; nothing was "
            "forked (run `roder fsck`)"
        )
    if title is None and source.title:
        title = f"{source.title} (fork)"
    extra = {**source.extra, "forked_from": {"thread_id": source_id, "sequence": sequence}}
    fork = await runtime.create_thread(uuid.uuid4().hex, title=title, extra=extra)
    try:
        if entries:
            await store.import_events(fork.thread_id, entries)
    except SequenceConflictError as exc:
        raise CommandError(
            f"thread {fork.thread_id} was written to during the fork by someone else; "
            f"nothing was copied and it is left as it is (inspect it with `roder threads "
            f"show {fork.thread_id}`), then fork again"
        ) from exc
    except BaseException:
        # Leave no half-made fork behind.
        try:
            await store.delete_thread(fork.thread_id)
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise
    return await store.get_thread(fork.thread_id), len(entries)


async def fork_command(args: argparse.Namespace) -> int:
    """Fork a thread at an event into a new thread."""
    async with open_runtime(args) as runtime:
        args.thread_id = await resolve_thread_id(runtime, args.thread_id)
        fork, copied = await fork_thread(runtime, args.thread_id, at=args.at, title=args.title)
    origin = forked_from(fork) or {}
    if args.json:
        print_json(
            {
                "thread_id": fork.thread_id,
                "title": fork.title,
                "forked_from": dict(origin),
                "events_copied": copied,
            }
        )
        return EXIT_OK
    print(f"thread: {fork.thread_id}")
    print(
        f"forked from {args.thread_id} at sequence {origin.get('sequence')} "
        f"({count(copied, 'event')}, {count(fork.item_count, 'item')} copied)"
    )
    return EXIT_OK


# --- prune --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Doomed:
    meta: ThreadMetadata
    size: int
    exact: bool


async def thread_size(store: ThreadStore, thread_id: str) -> tuple[int, bool]:
    """Return a thread's size in bytes and whether it is exact (else estimated).

    Stores that cannot tell (``thread_size_bytes`` returns None) get the size of the
    journal serialised as JSON lines.
    """
    size = await store.thread_size_bytes(thread_id)
    if size is not None:
        return size, True
    entries = await store.read_events(thread_id)
    return sum(len(codec_dumps(e)) + 1 for e in entries), False


async def prune_command(args: argparse.Namespace) -> int:
    """Delete threads not updated since ``--older-than`` (only show them with ``--dry-run``)."""
    cutoff: int = args.older_than
    async with open_runtime(args) as runtime:
        store = await runtime.store()
        threads = await all_threads(runtime)
        candidates = [m for m in threads[args.keep_last :] if m.updated_at_ms < cutoff]
        doomed: list[_Doomed] = []
        for meta in progress(candidates, total=len(candidates), desc="measuring", quiet=args.json):
            try:
                size, exact = await thread_size(store, meta.thread_id)
            except ThreadNotFoundError:
                continue  # deleted meanwhile
            doomed.append(_Doomed(meta, size, exact))
        deleted: list[_Doomed] = []
        if not args.dry_run and doomed:
            if not args.yes and on_terminal():
                print(f"about to delete {len(doomed)} thread(s):", file=sys.stderr)
                for item in doomed:
                    print(_summary_line(item.meta, item.size), file=sys.stderr)
                if not await confirm(f"delete them, freeing {_total(doomed)}?"):
                    print("roder: nothing was deleted", file=sys.stderr)
                    return EXIT_OK
            for item in progress(doomed, total=len(doomed), desc="deleting", quiet=args.json):
                try:
                    # A thread written to since it was listed is no longer old: keep it.
                    current = await store.get_thread(item.meta.thread_id)
                    if current.updated_at_ms >= cutoff:
                        continue
                    await store.delete_thread(item.meta.thread_id)
                except ThreadNotFoundError:
                    continue
                deleted.append(item)
    shown = doomed if args.dry_run else deleted
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "older_than": iso_ms(cutoff),
                "keep_last": args.keep_last,
                "threads": [
                    {
                        "thread_id": d.meta.thread_id,
                        "title": d.meta.title,
                        "updated_at_ms": d.meta.updated_at_ms,
                        "size_bytes": d.size,
                        "size_exact": d.exact,
                    }
                    for d in shown
                ],
                "count": len(shown),
                "bytes": sum(d.size for d in shown),
                "kept": len(threads) - len(shown),
            }
        )
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    if not shown:
        print(f"nothing to prune: no thread was last updated before {format_ms(cutoff)}")
        return EXIT_OK
    for item in shown:
        print(_summary_line(item.meta, item.size))
    print(
        f"{verb} {len(shown)} of {len(threads)} threads (last updated before "
        f"{format_ms(cutoff)}), {'freeing' if args.dry_run else 'freed'} {_total(shown)}"
    )
    if args.dry_run:
        print("dry run: nothing was deleted")
    return EXIT_OK


def _total(items: Sequence[_Doomed]) -> str:
    total = format_size(sum(d.size for d in items))
    return total if all(d.exact for d in items) else f"about {total}"
