"""`roder threads show` and `roder threads export`, and how they render a thread."""

from __future__ import annotations

import argparse
import sys

from roder_api.codec import to_dict
from roder_api.errors import ThreadNotFoundError
from roder_api.events import (
    AssistantContentDelta,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ErrorEvent,
    Event,
    ItemCompleted,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.threads import ThreadSnapshot
from roder_runtime import threads
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
    EXIT_OK,
    CommandError,
    format_ms,
    format_size,
    open_runtime,
    print_json,
    write_text_file,
)
from roder_runtime.cli._ids import resolve_thread_id
from roder_runtime.threads._export import describe_item, forked_from

# --- show ---------------------------------------------------------------------------------------


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


async def show_command(args: argparse.Namespace) -> int:
    """Show a thread's transcript, or with ``--events`` its raw journal."""
    async with open_runtime(args) as runtime:
        args.thread_id = await resolve_thread_id(runtime, args.thread_id)
        if args.events:
            meta, entries = await threads.read_journal(runtime, args.thread_id)
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
    origin = forked_from(meta)
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


async def export_command(args: argparse.Namespace) -> int:
    """Export a thread to stdout or a file."""
    if args.json and not args.output:
        raise CommandError("--json needs -o FILE (without it the export goes to stdout)", 2)
    async with open_runtime(args) as runtime:
        args.thread_id = await resolve_thread_id(runtime, args.thread_id)
        export = await threads.export_thread(runtime, args.thread_id, args.format)
    text, count = export.text, export.events
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
