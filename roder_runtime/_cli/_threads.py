"""``roder threads``: list and show threads."""

from __future__ import annotations

import argparse
from typing import Any

from roder_api.codec import to_dict
from roder_api.errors import ThreadNotFoundError
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
    EXIT_OK,
    CommandError,
    add_json_flag,
    format_ms,
    open_runtime,
    print_json,
)


def register(subparsers: Any) -> None:
    """Add the ``threads`` command group."""
    parser = subparsers.add_parser(
        "threads",
        help="list and inspect threads",
        description="List and inspect the threads of the configured store.",
    )
    sub = parser.add_subparsers(dest="threads_command", metavar="SUBCOMMAND", required=True)

    list_parser = sub.add_parser(
        "list",
        help="list threads, newest first",
        epilog="examples:\n  roder threads list\n  roder threads list --limit 10 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    list_parser.add_argument("--limit", type=int, default=50, help="threads per page")
    list_parser.add_argument("--cursor", help="continue after this cursor")
    add_json_flag(list_parser)
    list_parser.set_defaults(handler=list_command)

    show_parser = sub.add_parser(
        "show",
        help="show a thread's transcript",
        epilog="examples:\n  roder threads show ID\n  roder threads show ID --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show_parser.add_argument("thread_id", metavar="ID")
    add_json_flag(show_parser)
    show_parser.set_defaults(handler=show_command)


async def list_command(args: argparse.Namespace) -> int:
    """List threads newest first."""
    if args.limit < 1:
        raise CommandError("--limit must be at least 1", 2)
    async with open_runtime(args) as runtime:
        page = await runtime.list_threads(cursor=args.cursor, limit=args.limit)
    if args.json:
        print_json(
            {
                "threads": [to_dict(m) for m in page.threads],
                "next_cursor": page.next_cursor,
            }
        )
        return EXIT_OK
    if not page.threads:
        print("no threads")
    for meta in page.threads:
        title = meta.title or ""
        print(
            f"{meta.thread_id}  {format_ms(meta.updated_at_ms)}  {meta.item_count:>5} items  "
            f"{meta.usage.total_tokens:>8} tokens  {title}"
        )
    if page.next_cursor:
        print(f"more: roder threads list --cursor {page.next_cursor}")
    return EXIT_OK


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
        label = "native compaction boundary" if is_compaction_boundary(item) else "provider data"
        return f"({label})"
    return repr(item)


async def show_command(args: argparse.Namespace) -> int:
    """Show a thread's transcript."""
    async with open_runtime(args) as runtime:
        snapshot = await runtime.load_thread(args.thread_id)
    if snapshot is None:
        raise ThreadNotFoundError(args.thread_id)
    if args.json:
        print_json(
            {
                "metadata": to_dict(snapshot.metadata),
                "turns": [
                    {"turn_id": t.turn_id, "items": [to_dict(i) for i in t.items]}
                    for t in snapshot.turns
                ],
            }
        )
        return EXIT_OK
    meta = snapshot.metadata
    print(f"thread: {meta.thread_id}" + (f"  ({meta.title})" if meta.title else ""))
    print(
        f"created {format_ms(meta.created_at_ms)}, updated {format_ms(meta.updated_at_ms)}, "
        f"{meta.item_count} items, {meta.usage.total_tokens} tokens"
    )
    for turn in snapshot.turns:
        print(f"-- turn {turn.turn_id}")
        for item in turn.items:
            print(describe_item(item))
    return EXIT_OK
