"""``roder threads``: list, show, export, delete, fork and prune threads."""

from __future__ import annotations

import argparse
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from roder_api.codec import dumps as codec_dumps
from roder_api.codec import to_dict
from roder_api.errors import RoderError, ThreadNotFoundError
from roder_api.events import (
    AssistantContentDelta,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.threads import (
    ThreadMetadata,
    ThreadSnapshot,
    ThreadStore,
    encode_cursor,
    listing_key,
    validate_thread_id,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_runtime._cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_command,
    add_json_flag,
    confirm,
    count,
    format_ms,
    format_size,
    iso_ms,
    on_terminal,
    open_runtime,
    parse_moment,
    print_json,
    progress,
    write_text_file,
)
from roder_runtime._runtime import Runtime

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
            "roder threads list --json | jq -r '.threads[].thread_id' | "
            "xargs roder threads delete --yes",
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


async def list_command(args: argparse.Namespace) -> int:
    """List threads newest first, filtered and paged."""
    async with open_runtime(args) as runtime:
        threads, next_cursor = await _list_page(runtime, args)
    if args.json:
        print_json({"threads": [to_dict(m) for m in threads], "next_cursor": next_cursor})
        return EXIT_OK
    if not threads:
        print("no threads" + (" match" if _filtered(args) else ""))
    for meta in threads:
        print(
            f"{meta.thread_id}  {format_ms(meta.updated_at_ms)}  {meta.item_count:>5} items  "
            f"{meta.usage.total_tokens:>8} tokens  {meta.title or ''}".rstrip()
        )
    if next_cursor:
        print(f"more: {_next_page_command(args, next_cursor)}")
    return EXIT_OK


# --- show ---------------------------------------------------------------------------------------


def describe_item(item: TranscriptItem) -> str:
    """Return one readable line for a transcript item."""
    if isinstance(item, UserMessage):
        return f"you> {item.text}"
    if isinstance(item, AssistantMessage):
        mark = " [interrupted]" if item.interrupted else ""
        return f"assistant> {item.text}{mark}"
    if isinstance(item, Reasoning):
        return f"(reasoning) {item.text}"
    if isinstance(item, ToolCallRecord):
        return f"(tool call {item.id}) {item.name}({item.arguments})"
    if isinstance(item, ToolResultRecord):
        return f"(tool result {item.id}{' error' if item.is_error else ''}) {item.result}"
    if isinstance(item, ContextCompaction):
        return f"(compaction boundary) {item.summary}"
    if isinstance(item, ProviderMetadata):
        if is_compaction_boundary(item):
            kept = item.data.get("compacted_input")
            count = len(kept) if isinstance(kept, list) else 0
            return f"(native compaction boundary; replays {count} provider items first)"
        return "(provider data)"
    return repr(item)


def _clip(text: str, width: int = 80) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def describe_event(event: Event) -> str:
    """Return the type tag and a short readable summary of a journal event."""
    try:
        tag = str(to_dict(event).get("type", type(event).__name__))
    except Exception:  # noqa: BLE001 - an event this version cannot describe is still shown
        tag = type(event).__name__
    detail = ""
    if isinstance(event, TurnStarted | TurnComplete):
        detail = f"turn {event.turn_id}"
    elif isinstance(event, ModelStepStarted):
        detail = f"turn {event.turn_id} step {event.model_step_id}"
    elif isinstance(event, AssistantContentDelta):
        detail = f"{event.phase.value} {_clip(repr(event.delta))}"
    elif isinstance(event, ItemCompleted):
        detail = _clip(describe_item(event.item))
    elif isinstance(event, UsageUpdated):
        u = event.usage
        detail = (
            f"{event.purpose}: {u.prompt_tokens} prompt + {u.completion_tokens} completion "
            f"= {u.total_tokens} tokens"
        )
    elif isinstance(event, CompactionStarted | CompactionCommitted):
        detail = event.mode
    elif isinstance(event, CompactionDiscarded | TurnAborted):
        detail = event.reason
    elif isinstance(event, WarningEvent | ErrorEvent):
        detail = _clip(event.message)
    return f"{tag}  {detail}".rstrip()


async def _snapshot(runtime: Runtime, thread_id: str) -> ThreadSnapshot:
    snapshot = await runtime.load_thread(thread_id)
    if snapshot is None:
        raise ThreadNotFoundError(thread_id)
    return snapshot


async def _events_up_to(runtime: Runtime, thread_id: str, last: int) -> list[JournalEvent]:
    """Return events 1..``last``: those the metadata just read describes (writers may go on)."""
    if last < 1:
        return []
    return await (await runtime.store()).read_events(thread_id, limit=last)


def _forked_from(meta: ThreadMetadata) -> Mapping[str, Any] | None:
    origin = meta.extra.get("forked_from") if isinstance(meta.extra, Mapping) else None
    return origin if isinstance(origin, Mapping) else None


async def show_command(args: argparse.Namespace) -> int:
    """Show a thread's transcript, or with ``--events`` its raw journal."""
    async with open_runtime(args) as runtime:
        if args.events:
            meta = await runtime.get_thread(args.thread_id)
            entries = await _events_up_to(runtime, args.thread_id, meta.last_sequence)
            snapshot = None
        else:
            snapshot = await _snapshot(runtime, args.thread_id)
            meta, entries = snapshot.metadata, []
    if args.json:
        if snapshot is None:
            print_json({"metadata": to_dict(meta), "events": [to_dict(e) for e in entries]})
        else:
            print_json(
                {
                    "metadata": to_dict(meta),
                    "turns": [
                        {"turn_id": t.turn_id, "items": [to_dict(i) for i in t.items]}
                        for t in snapshot.turns
                    ],
                }
            )
        return EXIT_OK
    print(f"thread: {meta.thread_id}" + (f"  ({meta.title})" if meta.title else ""))
    print(
        f"created {format_ms(meta.created_at_ms)}, updated {format_ms(meta.updated_at_ms)}, "
        f"{meta.item_count} items, {meta.usage.total_tokens} tokens, "
        f"{meta.last_sequence} events"
    )
    origin = _forked_from(meta)
    if origin is not None:
        print(f"forked from {origin.get('thread_id')} at sequence {origin.get('sequence')}")
    if snapshot is None:
        for entry in entries:
            print(
                f"{entry.sequence:>6}  {format_ms(entry.recorded_at_ms)}  "
                f"{describe_event(entry.event)}"
            )
        return EXIT_OK
    for turn in snapshot.turns:
        print(f"-- turn {turn.turn_id}")
        for item in turn.items:
            print(describe_item(item))
    return EXIT_OK


# --- export -------------------------------------------------------------------------------------


def export_jsonl(meta: ThreadMetadata, entries: Sequence[JournalEvent]) -> str:
    """Return the JSON-lines export: the metadata, then each journal event, one per line."""
    lines = [codec_dumps(meta)]
    lines.extend(codec_dumps(entry) for entry in entries)
    return b"\n".join(lines).decode() + "\n"


def _fenced(text: str, lang: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text}\n{fence}"


def export_markdown(snapshot: ThreadSnapshot) -> str:
    """Return the Markdown export: a heading, the metadata, and every turn's items."""
    meta = snapshot.metadata
    out = [f"# {meta.title or 'Thread ' + meta.thread_id}", ""]
    out.append(f"- thread: `{meta.thread_id}`")
    out.append(f"- created: {format_ms(meta.created_at_ms)} UTC")
    out.append(f"- updated: {format_ms(meta.updated_at_ms)} UTC")
    out.append(f"- items: {meta.item_count}; tokens: {meta.usage.total_tokens}")
    origin = _forked_from(meta)
    if origin is not None:
        out.append(
            f"- forked from: `{origin.get('thread_id')}` at sequence {origin.get('sequence')}"
        )
    for number, turn in enumerate(snapshot.turns, start=1):
        out += ["", f"## Turn {number}", ""]
        for item in turn.items:
            out += [_markdown_item(item), ""]
        out.pop()
    return "\n".join(out) + "\n"


def _markdown_item(item: TranscriptItem) -> str:
    if isinstance(item, UserMessage):
        return f"**You:**\n\n{item.text}"
    if isinstance(item, AssistantMessage):
        mark = " *(interrupted)*" if item.interrupted else ""
        return f"**Assistant:**{mark}\n\n{item.text}"
    if isinstance(item, Reasoning):
        quoted = "\n".join(f"> {line}" for line in item.text.splitlines() or [""])
        return f"*Reasoning:*\n\n{quoted}"
    if isinstance(item, ToolCallRecord):
        return f"**Tool call** `{item.name}` (`{item.id}`):\n\n{_fenced(item.arguments, 'json')}"
    if isinstance(item, ToolResultRecord):
        label = "Tool error" if item.is_error else "Tool result"
        return f"**{label}** `{item.name}` (`{item.id}`):\n\n{_fenced(item.result)}"
    if isinstance(item, ContextCompaction):
        return f"---\n\n*Compaction summary:*\n\n{item.summary}\n\n---"
    return f"*{describe_item(item)}*"


async def export_command(args: argparse.Namespace) -> int:
    """Export a thread to stdout or a file."""
    if args.json and not args.output:
        raise CommandError("--json needs -o FILE (without it the export goes to stdout)", 2)
    async with open_runtime(args) as runtime:
        if args.format == "jsonl":
            meta = await runtime.get_thread(args.thread_id)
            entries = await _events_up_to(runtime, args.thread_id, meta.last_sequence)
            text = export_jsonl(meta, entries)
            count = len(entries)
        else:
            snapshot = await _snapshot(runtime, args.thread_id)
            text = export_markdown(snapshot)
            count = snapshot.metadata.last_sequence
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    await write_text_file(args.output, text)
    size = len(text.encode())
    if args.json:
        print_json(
            {
                "thread_id": args.thread_id,
                "format": args.format,
                "path": args.output,
                "events": count,
                "bytes": size,
            }
        )
    else:
        summary = f"{args.format}, {format_size(size)}"
        print(f"exported thread {args.thread_id} ({summary}) to {args.output}")
    return EXIT_OK


# --- delete -------------------------------------------------------------------------------------


async def _existing(runtime: Runtime, thread_ids: Sequence[str]) -> list[ThreadMetadata]:
    """Return the metadata of every thread; fail naming all the missing ones."""
    found: list[ThreadMetadata] = []
    missing: list[str] = []
    for thread_id in progress(thread_ids, total=len(thread_ids), desc="checking"):
        try:
            found.append(await runtime.get_thread(thread_id))
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
                return EXIT_FAILURE
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
        fork, copied = await fork_thread(runtime, args.thread_id, at=args.at, title=args.title)
    origin = _forked_from(fork) or {}
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


async def all_threads(runtime: Runtime) -> list[ThreadMetadata]:
    """Return every thread's metadata, newest update first."""
    threads: list[ThreadMetadata] = []
    cursor: str | None = None
    while True:
        page = await runtime.list_threads(cursor=cursor, limit=LIST_SCAN_PAGE)
        threads.extend(page.threads)
        if page.next_cursor is None:
            return threads
        cursor = page.next_cursor


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
                    return EXIT_FAILURE
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
        print(f"nothing to prune: no thread was last updated before {format_ms(cutoff)} UTC")
        return EXIT_OK
    for item in shown:
        print(_summary_line(item.meta, item.size))
    print(
        f"{verb} {len(shown)} of {len(threads)} threads (last updated before "
        f"{format_ms(cutoff)} UTC), {'freeing' if args.dry_run else 'freed'} {_total(shown)}"
    )
    if args.dry_run:
        print("dry run: nothing was deleted")
    return EXIT_OK


def _total(items: Sequence[_Doomed]) -> str:
    total = format_size(sum(d.size for d in items))
    return total if all(d.exact for d in items) else f"about {total}"
