"""``roder threads delete|fork|prune``: the commands that change the store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roder_api.errors import RoderError, SequenceConflictError, ThreadNotFoundError
from roder_api.threads import ThreadMetadata, validate_thread_id
from roder_runtime import threads
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
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
    progress_callback,
)
from roder_runtime.cli._ids import resolve_thread_id
from roder_runtime.threads._export import forked_from
from roder_runtime.threads._thread_ops import PrunableThread
from roder_runtime.threads._thread_ops import thread_size as thread_size  # the old home of the name

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
    """Return :func:`roder_runtime.threads.fork_thread`'s fork and the count copied.

    The command's form of it: a fork point past the end is a usage error and a fork that
    lost the race for its new thread a ``CommandError`` (its cause the store's
    ``SequenceConflictError``).
    """
    try:
        result = await threads.fork_thread(runtime, source_id, at=at, title=title)
    except SequenceConflictError as exc:
        raise CommandError(str(exc)) from (exc.__cause__ or exc)
    except ValueError as exc:
        if isinstance(exc, RoderError):
            raise
        raise CommandError(str(exc), EXIT_USAGE) from None
    return result.thread, result.events_copied


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


async def prune_command(args: argparse.Namespace) -> int:
    """Delete threads not updated since ``--older-than`` (only show them with ``--dry-run``)."""
    cutoff: int = args.older_than
    async with open_runtime(args) as runtime:
        with progress_callback("measuring", quiet=args.json) as measured:
            plan = await threads.plan_prune(
                runtime, older_than_ms=cutoff, keep_last=args.keep_last, on_progress=measured
            )
        doomed = list(plan.threads)
        deleted: list[PrunableThread] = []
        if not args.dry_run and doomed:
            if not args.yes and on_terminal():
                print(f"about to delete {len(doomed)} thread(s):", file=sys.stderr)
                for item in doomed:
                    print(_summary_line(item.metadata, item.size_bytes), file=sys.stderr)
                if not await confirm(f"delete them, freeing {_total(doomed)}?"):
                    print("roder: nothing was deleted", file=sys.stderr)
                    return EXIT_OK
            with progress_callback("deleting", quiet=args.json) as deleting:
                result = await threads.prune_threads(runtime, plan, on_progress=deleting)
            deleted = list(result.deleted)
            for _, busy in result.busy:
                print(f"roder: kept {busy.thread_id}: {busy}", file=sys.stderr)
    shown = doomed if args.dry_run else deleted
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "older_than": iso_ms(cutoff),
                "keep_last": args.keep_last,
                "threads": [
                    {
                        "thread_id": d.metadata.thread_id,
                        "title": d.metadata.title,
                        "updated_at_ms": d.metadata.updated_at_ms,
                        "size_bytes": d.size_bytes,
                        "size_exact": d.size_exact,
                    }
                    for d in shown
                ],
                "count": len(shown),
                "bytes": sum(d.size_bytes for d in shown),
                "kept": plan.thread_count - len(shown),
            }
        )
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    if not shown:
        print(f"nothing to prune: no thread was last updated before {format_ms(cutoff)}")
        return EXIT_OK
    for item in shown:
        print(_summary_line(item.metadata, item.size_bytes))
    print(
        f"{verb} {len(shown)} of {plan.thread_count} threads (last updated before "
        f"{format_ms(cutoff)}), {'freeing' if args.dry_run else 'freed'} {_total(shown)}"
    )
    if args.dry_run:
        print("dry run: nothing was deleted")
    return EXIT_OK


def _total(items: Sequence[PrunableThread]) -> str:
    total = format_size(sum(d.size_bytes for d in items))
    return total if all(d.size_exact for d in items) else f"about {total}"
