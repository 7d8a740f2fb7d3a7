"""``roder chat``: a durable chat on the configured store (the main job)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from roder_api.errors import ThreadNotFoundError
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    Event,
)
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime._cli._common import EXIT_FAILURE, EXIT_OK, open_runtime
from roder_runtime._runtime import DEFAULT_ENGINE

HISTORY_SHOWN = 10


def register(subparsers: Any) -> None:
    """Add the ``chat`` command."""
    parser = subparsers.add_parser(
        "chat",
        help="chat on a durable thread",
        description=(
            "Chat with a model on a durable thread. Reads one message per line from stdin; "
            "every event is persisted before it is shown. With no engine configured the "
            "scripted engine answers."
        ),
        epilog=(
            "examples:\n  roder chat\n  roder chat --thread 3f2a... \n"
            "  printf 'hi\\n' | roder chat\n  roder chat --engine openai --model gpt-5-mini"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--thread", metavar="ID", help="continue (or create) this thread")
    parser.add_argument("--engine", metavar="ID", help="engine id (default: default_engine)")
    parser.add_argument("--model", metavar="MODEL", help="model id (default: default_model)")
    parser.add_argument("--title", help="title of a new thread")
    parser.set_defaults(handler=chat_command)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def chat_command(args: argparse.Namespace) -> int:
    """Run the chat loop until end of input."""
    async with open_runtime(args) as runtime:
        engine_id = args.engine or runtime.config.default_engine
        if engine_id is None:
            print(
                "roder: no engine configured (default_engine in config.toml); "
                f"using the {DEFAULT_ENGINE!r} engine",
                file=sys.stderr,
            )
        engine = runtime.engine(engine_id)
        thread_id = args.thread
        if thread_id is None:
            thread_id = (await runtime.create_thread(title=args.title)).thread_id
            _write(f"thread: {thread_id}\n")
        else:
            snapshot = await runtime.load_thread(thread_id)
            if snapshot is None:
                await runtime.create_thread(thread_id, title=args.title)
                _write(f"thread: {thread_id}\n")
            else:
                items = [
                    i for i in snapshot.items if isinstance(i, (UserMessage, AssistantMessage))
                ]
                _write(f"thread: {thread_id} (resumed, {len(items)} earlier messages)\n")
                if len(items) > HISTORY_SHOWN:
                    _write(f"  ... {len(items) - HISTORY_SHOWN} earlier messages\n")
                for item in items[-HISTORY_SHOWN:]:
                    who = "you" if isinstance(item, UserMessage) else "assistant"
                    _write(f"  {who}> {item.text}\n")
        interactive = sys.stdin.isatty()
        failed = False
        while True:
            if interactive:
                _write("you> ")
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            text = line.rstrip("\n")
            if not text.strip():
                continue
            shown_reasoning = False

            async def show(events: Sequence[Event]) -> None:
                nonlocal shown_reasoning
                for event in events:
                    if isinstance(event, AssistantContentDelta):
                        if event.phase is ContentPhase.REASONING:
                            shown_reasoning = True
                            sys.stderr.write(event.delta)
                            sys.stderr.flush()
                        else:
                            if shown_reasoning:
                                sys.stderr.write("\n")
                                shown_reasoning = False
                            _write(event.delta)
                    elif isinstance(event, ErrorEvent):
                        print(f"\nroder: {event.message}", file=sys.stderr)

            try:
                reply = await runtime.run_turn(
                    thread_id, text, emit=show, engine=engine.id, model=args.model
                )
            except ThreadNotFoundError:
                raise
            _write("\n")
            if reply is None:
                failed = True
        return EXIT_FAILURE if failed else EXIT_OK
