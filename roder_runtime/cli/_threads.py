"""``roder threads``: list, show, export, delete, fork, prune, trace and cost threads."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from typing import Any

from roder_api.codec import to_dict
from roder_api.errors import RoderError
from roder_api.threads import (
    ThreadMetadata,
    encode_cursor,
    listing_key,
)
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_command,
    add_json_flag,
    format_ms,
    iso_ms,
    open_runtime,
    parse_moment,
    print_json,
)
from roder_runtime.cli._threads_manage import (
    delete_command,
    fork_command,
    prune_command,
)
from roder_runtime.cli._threads_obs import register as register_observability
from roder_runtime.cli._threads_show import export_command, show_command

LIST_SCAN_PAGE = 500
"""Threads read per store page while filtering a listing."""


def positive_int(text: str) -> int:
    """Return ``text`` as an integer of at least 1 (an argparse type)."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """Return ``text`` as an integer of at least 0 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def moment(text: str) -> int:
    """Return epoch milliseconds for a ``--updated-*`` or ``--older-than`` value."""
    return parse_moment(text)


def register(subparsers: Any) -> None:
    """Add the ``threads`` command group."""
    parser = add_command(
        subparsers,
        "threads",
        help="list, inspect, export, fork, delete and prune threads",
        description="Find, read, export, fork and clean up the threads of the configured store.",
        examples=(
            "roder threads list --title bug --updated-after 7d",
            "roder threads show ID",
            "roder threads export ID --format markdown -o thread.md",
            "roder threads fork ID --at 12",
            "roder threads prune --older-than 30d --keep-last 20 --dry-run",
            "roder threads trace ID -o trace.json",
            "roder threads cost ID --by turn",
        ),
    )
    sub = parser.add_subparsers(dest="threads_command", metavar="SUBCOMMAND", required=True)

    list_parser = add_command(
        sub,
        "list",
        help="list threads, newest update first",
        description=(
            "List threads, most recently updated first, one page at a time. Filters combine; "
            "times are dates (2026-01-31), ISO times (UTC unless a zone is given) or "
            "durations ago (7d, 12h)."
        ),
        examples=(
            "roder threads list",
            "roder threads list --limit 10 --json",
            "roder threads list --title 'release notes'",
            "roder threads list --updated-after 2026-01-01 --updated-before 2026-02-01",
            "roder threads list --updated-before 30d",
            "roder threads list --cursor CURSOR   # the next page",
            "roder threads list --all --json      # every thread, for scripts",
        ),
    )
    list_parser.add_argument(
        "--title", metavar="TEXT", help="only threads whose title contains TEXT (any case)"
    )
    list_parser.add_argument(
        "--updated-after", metavar="WHEN", type=moment, help="only threads updated at or after"
    )
    list_parser.add_argument(
        "--updated-before", metavar="WHEN", type=moment, help="only threads updated before"
    )
    list_parser.add_argument(
        "--limit", metavar="N", type=positive_int, default=50, help="threads per page (50)"
    )
    list_parser.add_argument("--cursor", help="continue after this cursor (from the last page)")
    list_parser.add_argument(
        "--all", action="store_true", help="every matching thread, all pages at once"
    )
    add_json_flag(list_parser)
    list_parser.set_defaults(handler=list_command)

    show_parser = add_command(
        sub,
        "show",
        help="show a thread's transcript, or its raw journal",
        description=(
            "Show a thread's transcript as readable text, grouped by turn; with --events, "
            "every journal event with its sequence number and time (the sequence numbers "
            "`roder threads fork --at` takes)."
        ),
        examples=(
            "roder threads show ID",
            "roder threads show ID --events",
            "roder threads show ID --json",
        ),
    )
    show_parser.add_argument("thread_id", metavar="ID", help="the thread's id")
    show_parser.add_argument(
        "--events", action="store_true", help="show the raw journal instead of the transcript"
    )
    add_json_flag(show_parser)
    show_parser.set_defaults(handler=show_command)

    export_parser = add_command(
        sub,
        "export",
        help="export a thread as JSON lines or Markdown",
        description=(
            "Export a thread. jsonl: the metadata, then every journal event verbatim, one "
            "JSON object per line (lossless). markdown: the transcript for people. Writes to "
            "stdout, or whole-or-nothing to a file with -o."
        ),
        examples=(
            "roder threads export ID > thread.jsonl",
            "roder threads export ID --format markdown -o thread.md",
            "roder threads export ID -o thread.jsonl --json",
        ),
    )
    export_parser.add_argument("thread_id", metavar="ID", help="the thread's id")
    export_parser.add_argument(
        "--format",
        choices=("jsonl", "markdown"),
        default="jsonl",
        help="jsonl (default), markdown",
    )
    export_parser.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE instead of stdout"
    )
    add_json_flag(export_parser)
    export_parser.set_defaults(handler=export_command)

    delete_parser = add_command(
        sub,
        "delete",
        help="delete threads",
        description=(
            "Delete threads and their journals. Asks first on a terminal; without a terminal "
            "it refuses (exit 2) unless --yes is given. Nothing is deleted when an ID is not "
            "found."
        ),
        examples=(
            "roder threads delete ID",
            "roder threads delete ID1 ID2 --yes",
            "roder threads list --all --updated-before 90d --json | "
            "jq -r '.threads[].thread_id' | xargs roder threads delete --yes",
        ),
    )
    delete_parser.add_argument("thread_ids", metavar="ID", nargs="+", help="threads to delete")
    delete_parser.add_argument("-y", "--yes", action="store_true", help="do not ask")
    add_json_flag(delete_parser)
    delete_parser.set_defaults(handler=delete_command)

    fork_parser = add_command(
        sub,
        "fork",
        help="copy a thread's history, up to an event, into a new thread",
        description=(
            "Create a new thread whose journal is the source's events up to and including "
            "SEQUENCE (default: all), copied verbatim. The source is not touched. The fork "
            "records where it came from in its metadata (extra.forked_from)."
        ),
        examples=(
            "roder threads fork ID",
            "roder threads fork ID --at 12 --title 'try another answer'",
            "roder chat --thread $(roder threads fork ID --json | jq -r .thread_id)",
        ),
    )
    fork_parser.add_argument("thread_id", metavar="ID", help="the thread to fork (untouched)")
    fork_parser.add_argument(
        "--at",
        metavar="SEQUENCE",
        type=non_negative_int,
        help="last event to copy (see `roder threads show ID --events`)",
    )
    fork_parser.add_argument("--title", help="title of the fork (default: the source's + (fork))")
    add_json_flag(fork_parser)
    fork_parser.set_defaults(handler=fork_command)

    prune_parser = add_command(
        sub,
        "prune",
        help="delete threads not updated for a while",
        description=(
            "Delete threads last updated before a time: a duration ago (30d, 12h, 2w) or a "
            "date. --keep-last keeps the N most recently updated threads whatever their age. "
            "--dry-run shows what would go and how much space it frees, and changes nothing. "
            "On a terminal it asks first unless --yes is given."
        ),
        examples=(
            "roder threads prune --older-than 30d --dry-run",
            "roder threads prune --older-than 30d --keep-last 20",
            "roder threads prune --older-than 2026-01-01 --yes --json",
        ),
    )
    prune_parser.add_argument(
        "--older-than",
        metavar="WHEN",
        type=moment,
        required=True,
        help="prune threads last updated before this (30d, 12h, 2026-01-01)",
    )
    prune_parser.add_argument(
        "--keep-last",
        metavar="N",
        type=non_negative_int,
        default=0,
        help="always keep the N most recently updated threads",
    )
    prune_parser.add_argument(
        "--dry-run", action="store_true", help="show what would be deleted; delete nothing"
    )
    prune_parser.add_argument("-y", "--yes", action="store_true", help="do not ask")
    add_json_flag(prune_parser)
    prune_parser.set_defaults(handler=prune_command)

    register_observability(sub)


# --- list -------------------------------------------------------------------------------------


def _matches(meta: ThreadMetadata, args: argparse.Namespace) -> bool:
    if args.title is not None and args.title.casefold() not in (meta.title or "").casefold():
        return False
    if args.updated_after is not None and meta.updated_at_ms < args.updated_after:
        return False
    if args.updated_before is not None and meta.updated_at_ms >= args.updated_before:
        return False
    return True


def _filtered(args: argparse.Namespace) -> bool:
    return (
        args.title is not None or args.updated_after is not None or args.updated_before is not None
    )


async def _list_page(
    runtime: Runtime, args: argparse.Namespace
) -> tuple[list[ThreadMetadata], str | None]:
    """Return up to ``--limit`` matching threads and the cursor of the next page (or None)."""
    try:
        if not _filtered(args):
            page = await runtime.list_threads(cursor=args.cursor, limit=args.limit)
            return list(page.threads), page.next_cursor
        found: list[ThreadMetadata] = []
        cursor = args.cursor
        while True:
            page = await runtime.list_threads(cursor=cursor, limit=max(args.limit, LIST_SCAN_PAGE))
            for index, meta in enumerate(page.threads):
                if args.updated_after is not None and meta.updated_at_ms < args.updated_after:
                    # Listings are newest first: nothing further on can match.
                    return found, None
                if not _matches(meta, args):
                    continue
                found.append(meta)
                if len(found) == args.limit:
                    more = index + 1 < len(page.threads) or page.next_cursor is not None
                    # Every store pages with the shared cursor helpers of roder_api.threads,
                    # so a cursor after the last thread shown continues the scan there.
                    return found, encode_cursor(*listing_key(meta)) if more else None
            if page.next_cursor is None:
                return found, None
            cursor = page.next_cursor
    except ValueError as exc:
        if isinstance(exc, RoderError):
            raise
        # A malformed --cursor: the store says so in a plain ValueError.
        raise CommandError(str(exc), EXIT_USAGE) from None


def _next_page_command(args: argparse.Namespace, cursor: str) -> str:
    parts = ["roder threads list"]
    if args.title is not None:
        parts.append(f"--title {shlex.quote(args.title)}")
    if args.updated_after is not None:
        parts.append(f"--updated-after {iso_ms(args.updated_after)}")
    if args.updated_before is not None:
        parts.append(f"--updated-before {iso_ms(args.updated_before)}")
    if args.limit != 50:
        parts.append(f"--limit {args.limit}")
    parts.append(f"--cursor {cursor}")
    return " ".join(parts)


def _first_prompt(meta: ThreadMetadata, width: int = 60) -> str:
    """Return the thread's first prompt as the listing shows it (one line, cut), or ""."""
    found = meta.extra.get("first_prompt") if isinstance(meta.extra, Mapping) else None
    if not isinstance(found, str) or not found.strip():
        return ""
    line = " ".join(found.split())
    shown = line if len(line) <= width else line[: width - 1] + "…"
    return f"  {shown!r}" if not meta.title else f"  ({shown!r})"


async def list_command(args: argparse.Namespace) -> int:
    """List threads newest first, filtered and paged."""
    async with open_runtime(args) as runtime:
        if args.all:
            threads, next_cursor = [], None
            while True:
                page, next_cursor = await _list_page(runtime, args)
                threads.extend(page)
                if next_cursor is None:
                    break
                args.cursor = next_cursor
        else:
            threads, next_cursor = await _list_page(runtime, args)
    if args.json:
        print_json({"threads": [to_dict(m) for m in threads], "next_cursor": next_cursor})
        return EXIT_OK
    if not threads:
        print("no threads" + (" match" if _filtered(args) else ""))
    for meta in threads:
        print(
            f"{meta.thread_id}  {format_ms(meta.updated_at_ms)}  {meta.item_count:>5} items  "
            f"{meta.usage.total_tokens:>8} tokens  {meta.title or ''}{_first_prompt(meta)}".rstrip()
        )
    if next_cursor:
        print(f"more: {_next_page_command(args, next_cursor)}")
    return EXIT_OK
