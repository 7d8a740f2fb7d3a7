"""What ``roder chat`` and ``roder prompt`` read: a line editor on a terminal, else stdin whole.

On a terminal the chat reads lines with prompt_toolkit: arrow keys, Emacs-style editing,
history across chats (``$RODER_HOME/chat_history``) and searchable with Ctrl-R. It was chosen
over the standard library's ``readline`` because ``readline`` is GNU readline or libedit
depending on the platform (with different keys and history files), is missing on some
builds, and leaves the terminal in its raw mode when the program exits while a line is being
read in another thread; prompt_toolkit behaves the same everywhere, reads Ctrl-C at the
prompt as a key rather than a signal, and restores the terminal before returning.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio.to_thread

HISTORY_FILE = "chat_history"
"""The chat's line history, in ``$RODER_HOME``."""


def warn(text: str) -> None:
    """Write a warning line on stderr."""
    sys.stderr.write(f"roder: warning: {text}\n")
    sys.stderr.flush()


def decode_input(data: bytes, where: str) -> str:
    """Return ``data`` decoded as UTF-8; undecodable bytes become U+FFFD, with a warning."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        warn(
            f"{where} is not valid UTF-8 (byte {exc.start}); undecodable bytes were replaced "
            "with U+FFFD"
        )
        return data.decode("utf-8", errors="replace")


def clean_argument(text: str, where: str = "the prompt argument") -> str:
    """Return a command-line argument as valid text (undecodable bytes replaced, warned)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return decode_input(os.fsencode(text), where)


async def read_stdin() -> str:
    """Return all of stdin (read in a worker thread), decoded as UTF-8 with replacement."""
    stream: Any = getattr(sys.stdin, "buffer", None)
    if stream is None:  # stdin closed or replaced by something without bytes
        return ""
    data: bytes = await anyio.to_thread.run_sync(stream.read)
    return decode_input(data, "stdin")


class LineEditor:
    """Reads one line at a time on the terminal, with editing and a history file."""

    def __init__(self, home: Path) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history: FileHistory | InMemoryHistory
        try:
            home.mkdir(parents=True, exist_ok=True)
            path = home / HISTORY_FILE
            # What people type can be private: the history is theirs alone to read.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            history = FileHistory(str(path))
        except OSError as exc:
            warn(f"cannot keep the chat history in {home / HISTORY_FILE}: {exc.strerror}")
            history = InMemoryHistory()
        output = None
        if not sys.stdout.isatty() and sys.stderr.isatty():
            # `roder chat > answers.txt`: stdout keeps only the replies, so the prompt and
            # the editor's drawing (carriage returns, escapes) go to the terminal on stderr.
            from prompt_toolkit.output import create_output

            output = create_output(stdout=sys.stderr)
        self._session: Any = PromptSession(history=history, output=output)

    async def read(self, prompt: str) -> str | None:
        """Return the next line, or None at the end of input (Ctrl-D).

        Raise ``KeyboardInterrupt`` when Ctrl-C is pressed at the prompt.
        """
        return await anyio.to_thread.run_sync(self._read, prompt)

    def _read(self, prompt: str) -> str | None:
        try:
            line: str = self._session.prompt(prompt)
        except EOFError:
            return None
        return line
