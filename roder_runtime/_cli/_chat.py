"""``roder chat``: a durable chat on the configured store (the main job)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from roder_api.errors import InputTooLargeError, RoderError
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    TurnAborted,
    TurnComplete,
    WarningEvent,
)
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime._cli._common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, open_runtime
from roder_runtime._runtime import DEFAULT_ENGINE
from roder_runtime._session import Interrupt, Session, UserInput
from roder_runtime._turns import new_id

HISTORY_SHOWN = 10


def register(subparsers: Any) -> None:
    """Add the ``chat`` command."""
    parser = subparsers.add_parser(
        "chat",
        help="chat on a durable thread",
        description=(
            "Chat with a model on a durable thread. Reads one message per line from stdin; "
            "replies stream as they arrive and every event is persisted before it is shown. "
            "Ctrl-C stops the running turn (its text so far is kept); Ctrl-C at the prompt "
            "ends the chat. With no engine configured the scripted engine answers."
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


def _note(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _read_lines(send: MemoryObjectSendStream[str], token: EventLoopToken) -> None:
    """Forward stdin lines to the event loop (a daemon thread: a blocked read never holds
    the program open)."""
    try:
        for line in sys.stdin:
            anyio.from_thread.run(send.send, line, token=token)
        anyio.from_thread.run(send.aclose, token=token)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
        return  # the chat ended first


async def chat_command(args: argparse.Namespace) -> int:
    """Run the chat loop until end of input (or Ctrl-C at the prompt)."""
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
        async with runtime.start_session(
            thread_id, engine=engine.id, model=args.model, owner="roder chat"
        ) as session:
            return await _Chat(session, interactive=sys.stdin.isatty()).run()


class _Chat:
    """One chat on a session: a reader of stdin, a printer of events, Ctrl-C handling."""

    def __init__(self, session: Session, *, interactive: bool) -> None:
        self.session = session
        self.interactive = interactive
        self.turn_id: str | None = None
        self.turn_done = anyio.Event()
        self.failed = False
        self.exit_code: int | None = None
        self.shown_reasoning = False

    async def run(self) -> int:
        send, receive = anyio.create_memory_object_stream[str](1)
        reader = threading.Thread(
            target=_read_lines,
            args=(send, anyio.lowlevel.current_token()),
            name="roder-chat-stdin",
            daemon=True,
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._print_events, tasks.cancel_scope)
            tasks.start_soon(self._watch_sigint, tasks.cancel_scope)
            reader.start()
            async with receive:
                await self._converse(receive)
            tasks.cancel_scope.cancel()
        if self.exit_code is not None:
            return self.exit_code
        return EXIT_FAILURE if self.failed else EXIT_OK

    async def _converse(self, lines: MemoryObjectReceiveStream[str]) -> None:
        while True:
            if self.interactive:
                _write("you> ")
            try:
                line = await lines.receive()
            except anyio.EndOfStream:
                return
            text = line.rstrip("\n")
            if not text.strip():
                continue
            self.turn_done = anyio.Event()
            # The id is the chat's before submit returns: the turn may end before that.
            self.turn_id = new_id("turn")
            try:
                await self.session.submit(UserInput(text), turn_id=self.turn_id)
            except InputTooLargeError as exc:
                _note(f"roder: {exc}\n")
                self.failed = True
                continue
            await self.turn_done.wait()
            self.turn_id = None
            _write("\n")

    async def _watch_sigint(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                turn_id = self.turn_id
                if turn_id is not None and not self.turn_done.is_set():
                    # Ctrl-C stops the turn, not the program.
                    await self.session.submit(Interrupt(turn_id))
                    continue
                # Ctrl-C at the prompt ends the chat.
                _note("\nroder: interrupted\n")
                self.exit_code = EXIT_INTERRUPTED
                scope.cancel()
                return

    async def _print_events(self, scope: anyio.CancelScope) -> None:
        while True:
            try:
                event = (await self.session.next_event()).event
            except RoderError as exc:
                # The store failed: what was shown is journaled, nothing more can be.
                _note(f"\nroder: error: {exc}\n")
                self.exit_code = EXIT_FAILURE
                scope.cancel()
                return
            if isinstance(event, AssistantContentDelta):
                if event.phase is ContentPhase.REASONING:
                    self.shown_reasoning = True
                    _note(event.delta)
                else:
                    if self.shown_reasoning:
                        _note("\n")
                        self.shown_reasoning = False
                    _write(event.delta)
            elif isinstance(event, ErrorEvent):
                _note(f"\nroder: {event.message}\n")
            elif isinstance(event, WarningEvent):
                _note(f"\nroder: warning: {event.message}\n")
            elif isinstance(event, (TurnComplete, TurnAborted)):
                if event.turn_id != self.turn_id:
                    if isinstance(event, TurnAborted) and event.reason == "process_exited":
                        _note("roder: the last turn was cut off when its process exited\n")
                    continue
                if isinstance(event, TurnAborted):
                    if event.reason == "interrupted":
                        _note("\nroder: turn interrupted")
                    else:
                        self.failed = True
                self.turn_done.set()
