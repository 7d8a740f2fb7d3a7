"""``roder chat`` and ``roder prompt``: durable chats on the configured store (the main job).

On a terminal ``roder chat`` is a conversation with line editing, history and ``/``
commands. Anywhere else (a pipe, a file) stdin is read whole and sent as one prompt, like
``roder prompt``. A thread is created only when there is something to send.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from roder_api.errors import (
    InputTooLargeError,
    RoderError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime._runtime import DEFAULT_ENGINE, Runtime
from roder_runtime.cli._chat_input import LineEditor, clean_argument, read_stdin
from roder_runtime.cli._chat_turn import Ask, TurnOutcome, follow_turn, note, run_turn
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    add_command,
    on_terminal,
    open_runtime,
)
from roder_runtime.cli._compact import run_compact
from roder_runtime.cli._ids import latest_thread_id, resolve_thread_id
from roder_runtime.config._config import roder_home
from roder_runtime.session._session import Session

HISTORY_SHOWN = 10
"""How many earlier messages a resumed chat shows."""

PROMPT = "you> "

FIRST_PROMPT_CHARS = 200
"""How much of a new thread's first prompt its metadata keeps (``extra["first_prompt"]``)."""

HELP = """\
commands (anything else is sent to the model; start a line with // to send a leading /):
  /help             this list
  /exit             end the chat (also /quit, exit, quit, Ctrl-D; Ctrl-C at the prompt)
  /new              start a new thread with the next message
  /thread [ID]      show the thread's id, or continue thread ID (a unique prefix will do)
  /model [MODEL]    show the engine and model, or use MODEL from the next message on
  /compact          compact the thread now (what the next model call replays shrinks)
Ctrl-C while a reply streams stops it (the text so far is kept)."""


def _add_chat_options(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--thread", metavar="ID", help="continue this thread (a unique id prefix will do)"
    )
    which.add_argument(
        "-c",
        "--continue",
        dest="continue_",
        action="store_true",
        help="continue the most recently updated thread",
    )
    parser.add_argument("--engine", metavar="ID", help="engine id (default: default_engine)")
    parser.add_argument("--model", metavar="MODEL", help="model id (default: the engine's)")
    parser.add_argument(
        "--system", metavar="TEXT", help="instructions for the model (default: instructions)"
    )
    parser.add_argument("--title", help="title of a new thread")


def register(subparsers: Any) -> None:
    """Add the ``chat`` and ``prompt`` commands."""
    chat = add_command(
        subparsers,
        "chat",
        help="chat on a durable thread",
        description=(
            "Chat with a model on a durable thread; every event is persisted before it is "
            "shown. On a terminal: line editing, history and /commands (/help lists them); "
            "Ctrl-C stops the running reply (its text so far is kept), Ctrl-C or Ctrl-D at "
            "the prompt ends the chat. Piped stdin is sent whole, as one prompt. Replies go "
            "to stdout, everything else (the thread id, notes, errors) to stderr. With no "
            "engine configured the scripted engine answers."
        ),
        examples=(
            "roder chat",
            "roder chat -c                          continue the latest thread",
            "roder chat --thread 3f2a               continue a thread (unique id prefix)",
            "roder chat --engine openai --model gpt-5-mini",
            "cat notes.txt | roder chat             the whole file as one prompt",
        ),
    )
    _add_chat_options(chat)
    chat.set_defaults(handler=chat_command)
    prompt = add_command(
        subparsers,
        "prompt",
        help="send one prompt and print the reply",
        description=(
            "Send one prompt on a new thread (or --thread / -c) and print the reply on "
            "stdout. Piped stdin and TEXT are one prompt: stdin first, then a space and "
            "TEXT (as llm does). With no TEXT, or TEXT '-', stdin alone is the prompt."
        ),
        examples=(
            'roder prompt "Name three prime numbers"',
            'roder prompt -c "and three more"       continue the latest thread',
            "git diff | roder prompt --system 'Review this diff'",
            "cat notes.txt | roder prompt 'Summarise the notes above'",
        ),
    )
    prompt.add_argument("text", nargs="*", metavar="TEXT", help="the prompt (words are joined)")
    _add_chat_options(prompt)
    prompt.set_defaults(handler=prompt_command)


async def _start_thread(runtime: Runtime, args: argparse.Namespace) -> str | None:
    """Return the thread to continue (``--thread`` or ``-c``), or None for a new one."""
    if args.thread is not None:
        return await resolve_thread_id(runtime, args.thread)
    if args.continue_:
        latest = await latest_thread_id(runtime)
        if latest is None:
            note("roder: no thread to continue yet; starting a new one")
        return latest
    return None


class _Chat:
    """A chat's state: the runtime, the engine and model, the thread and its session."""

    def __init__(self, runtime: Runtime, args: argparse.Namespace) -> None:
        self.runtime = runtime
        if args.system is not None:
            runtime.config.instructions = clean_argument(args.system, "--system")
        engine_id = args.engine or runtime.config.default_engine
        if engine_id is None:
            note(
                "roder: no engine configured (default_engine in config.toml); "
                f"using the {DEFAULT_ENGINE!r} engine"
            )
        self.engine = runtime.engine(engine_id)
        self.model: str | None = args.model
        self.title: str | None = args.title
        self.thread_id: str | None = None
        self.session: Session | None = None
        self.owner = f"roder {args.command}"  # named to whoever finds the thread in use
        self.ask: Ask | None = None  # how tool approvals are asked (on a terminal)
        self.created: str | None = None  # the thread this chat made, until it is answered

    @property
    def model_label(self) -> str:
        return self.model or self.runtime.default_model(self.engine)

    async def open_session(self, announce: bool = False, first_prompt: str = "") -> Session:
        """Return the session, creating the thread on first use.

        A new thread keeps the start of ``first_prompt`` in its metadata
        (``extra["first_prompt"]``), for ``roder threads list`` to show without reading
        the journal.

        A new thread's id is announced on stderr (``thread: <id>``), and an existing one's
        with ``announce``, once the session holds it: a thread in use is refused unnamed.
        """
        if self.session is not None:
            return self.session
        created = self.thread_id is None
        if self.thread_id is None:
            extra = {"first_prompt": first_prompt[:FIRST_PROMPT_CHARS]} if first_prompt else None
            meta = await self.runtime.create_thread(title=self.title, extra=extra)
            self.thread_id = self.created = meta.thread_id
        try:
            self.session = await self.runtime.start_session(
                self.thread_id, engine=self.engine.id, model=self.model, owner=self.owner
            )
        except ThreadBusyError as exc:
            who = exc.holder.describe() if exc.holder is not None else "another session"
            raise CommandError(f"thread {exc.thread_id} is in use by {who}") from None
        if created or announce:
            note(f"thread: {self.thread_id}")
        return self.session

    async def close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.aclose()

    async def send(self, text: str) -> TurnOutcome:
        session = await self.open_session(first_prompt=text)
        try:
            outcome = await run_turn(session, text, self.ask)
        except InputTooLargeError as exc:
            note(f"roder: {exc}")
            outcome = TurnOutcome.FAILED
        if outcome is not TurnOutcome.FAILED:
            self.created = None  # answered: the thread is the person's now
        elif self.created is not None and self.created == self.thread_id:
            await self._discard_created()
        return outcome

    async def _discard_created(self) -> None:
        """Remove the thread this chat made when its first input was refused or failed.

        Refused work changes nothing: no new thread is left behind holding only a
        refusal (an input over the size limit, a key the server does not accept).
        """
        thread_id, self.created = self.created, None
        if thread_id is None:
            return
        await self.close_session()
        self.thread_id = None
        with contextlib.suppress(RoderError):
            await self.runtime.delete_thread(thread_id)
            note(f"roder: thread {thread_id} was not kept: nothing was answered in it")

    async def show_resumed(self, thread_id: str) -> None:
        snapshot = await self.runtime.load_thread(thread_id)
        if snapshot is None:
            return
        items = [i for i in snapshot.items if isinstance(i, (UserMessage, AssistantMessage))]
        note(f"thread: {thread_id} (resumed, {len(items)} earlier messages)")
        if len(items) > HISTORY_SHOWN:
            note(f"  ... {len(items) - HISTORY_SHOWN} earlier messages")
        for item in items[-HISTORY_SHOWN:]:
            who = "you" if isinstance(item, UserMessage) else "assistant"
            note(f"  {who}> {item.text}")

    async def finish_resumed(self) -> TurnOutcome | None:
        """Show the turn the session resumed (cut off in a tool step) before anything is
        typed: a pending approval is asked again at once. Return its outcome, or None."""
        session = self.session
        if session is None or session.resumed_turn_id is None:
            return None
        note("roder: finishing the last turn, cut off while it ran tools")
        return await follow_turn(session, session.resumed_turn_id, self.ask)


async def chat_command(args: argparse.Namespace) -> int:
    """Chat on a terminal, or send piped stdin as one prompt."""
    if not on_terminal():
        return await _one_prompt(args, await read_stdin())
    async with open_runtime(args) as runtime:
        chat = _Chat(runtime, args)
        chat.thread_id = await _start_thread(runtime, args)
        try:
            editor = LineEditor(roder_home())
            chat.ask = editor.read
            if chat.thread_id is not None:
                await chat.open_session()  # a busy thread is refused before anything is typed
                await chat.show_resumed(chat.thread_id)
                if await chat.finish_resumed() is TurnOutcome.PENDING:
                    return EXIT_OK
            return await _converse(chat, editor)
        finally:
            await chat.close_session()


async def prompt_command(args: argparse.Namespace) -> int:
    """Send one prompt and print the reply: piped stdin, then TEXT, as one prompt.

    As ``llm`` does, what was piped comes first and TEXT after it, joined by a space
    (``git diff | roder prompt "review this"``). TEXT ``-`` is no text: stdin alone.
    """
    words: Sequence[str] = [] if list(args.text) == ["-"] else args.text
    piped = "" if on_terminal() else await read_stdin()
    if not words and on_terminal():
        raise CommandError("no prompt: give TEXT, or pipe it to stdin", 2)
    parts = [piped] if piped.strip() else []
    if words:
        parts.append(clean_argument(" ".join(words)))
    return await _one_prompt(args, " ".join(parts))


async def _one_prompt(args: argparse.Namespace, text: str) -> int:
    if not text.strip():
        async with open_runtime(args) as runtime:
            _Chat(runtime, args)  # the engine it names is looked up: a wrong one is an error
        note("roder: nothing to send (the input is empty); no thread was created")
        return EXIT_OK
    text = text.rstrip()  # the newline that ends a file or an echo is not part of the prompt
    async with open_runtime(args) as runtime:
        chat = _Chat(runtime, args)
        chat.thread_id = await _start_thread(runtime, args)
        try:
            await chat.open_session(announce=True, first_prompt=text)
            outcome = await chat.send(text)
        finally:
            await chat.close_session()
    if outcome is TurnOutcome.INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_OK if outcome is TurnOutcome.COMPLETED else EXIT_FAILURE


async def _converse(chat: _Chat, editor: LineEditor) -> int:
    """Read lines until /exit or the end of input; return the exit code."""
    failed = False
    while True:
        try:
            line = await editor.read(PROMPT)
        except KeyboardInterrupt:
            note("roder: interrupted")
            return EXIT_INTERRUPTED
        if line is None:
            return EXIT_FAILURE if failed else EXIT_OK
        text = line.strip()
        if not text:
            continue
        if text in ("exit", "quit"):
            return EXIT_FAILURE if failed else EXIT_OK
        if text.startswith("/") and not text.startswith("//"):
            if await _command(chat, text):
                return EXIT_FAILURE if failed else EXIT_OK
            continue
        if text.startswith("//"):
            line = line.lstrip()[1:]
        outcome = await chat.send(line)
        if outcome is TurnOutcome.PENDING:  # ended at an approval question
            return EXIT_FAILURE if failed else EXIT_OK
        if outcome is TurnOutcome.FAILED:
            failed = True


async def _command(chat: _Chat, text: str) -> bool:
    """Run a ``/`` command; return True when the chat should end."""
    name, _, rest = text.partition(" ")
    rest = rest.strip()
    if name in ("/exit", "/quit"):
        return True
    if name == "/help":
        note(HELP)
    elif name == "/new":
        await chat.close_session()
        chat.thread_id = None
        note("roder: the next message starts a new thread")
    elif name == "/thread":
        if not rest:
            note(f"thread: {chat.thread_id}" if chat.thread_id else "roder: no thread yet")
            return False
        try:
            thread_id = await resolve_thread_id(chat.runtime, rest)
        except (CommandError, ThreadNotFoundError) as exc:
            note(f"roder: {exc}")
            return False
        previous = chat.thread_id
        await chat.close_session()
        chat.thread_id = thread_id
        try:
            await chat.open_session()
        except CommandError as exc:
            note(f"roder: {exc}")
            chat.thread_id = previous
            return False
        await chat.show_resumed(thread_id)
        if await chat.finish_resumed() is TurnOutcome.PENDING:
            return True
    elif name == "/model":
        if rest:
            await chat.close_session()
            chat.model = rest
        note(f"engine: {chat.engine.id}, model: {chat.model_label}")
    elif name == "/compact":
        await _compact(chat)
    else:
        note(f"roder: unknown command {name}; /help lists the commands")
    return False


async def _compact(chat: _Chat) -> None:
    if chat.thread_id is None:
        note("roder: nothing to compact yet")
        return
    await chat.close_session()
    args = argparse.Namespace(
        thread_id=chat.thread_id, engine=chat.engine.id, model=chat.model, json=False
    )
    # What /compact reports is not a reply: it goes to stderr with the other notes.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            await run_compact(chat.runtime, args)
        except CommandError as exc:
            note(f"roder: {exc}")
