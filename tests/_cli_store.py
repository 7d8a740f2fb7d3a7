"""Helpers for the CLI tests: seed a real JSONL store with backdated threads, snapshot it."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from roder_api.events import (
    ItemCompleted,
    JournalEvent,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import AssistantMessage, TranscriptItem, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory

from .conftest import roder_command

DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True)
class Seed:
    """A thread to create: its id, title, age in days and transcript items (by turn)."""

    thread_id: str
    title: str | None = None
    age_days: float = 0
    turns: Sequence[Sequence[TranscriptItem]] = ()


def store_base(env: dict[str, str]) -> Path:
    """Return the JSONL store directory that ``roder`` uses in ``env``."""
    return Path(env["RODER_HOME"]) / "threads"


def seed(env: dict[str, str], *seeds: Seed) -> None:
    """Create threads whose metadata and journal events were recorded ``age_days`` ago."""
    now = int(time.time() * 1000)

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base_path=store_base(env)).open()
        async with store:
            for s in seeds:
                at = now - int(s.age_days * DAY_MS)
                await store.create_thread(ThreadMetadata(s.thread_id, at, at, s.title))
                turns = s.turns or [
                    [UserMessage(f"hello {s.thread_id}"), AssistantMessage(f"hi {s.thread_id}")]
                ]
                events: list[object] = []
                for number, items in enumerate(turns, start=1):
                    turn_id = f"turn-{number}"
                    events.append(TurnStarted(turn_id))
                    events += [ItemCompleted(turn_id, item) for item in items]
                    events.append(UsageUpdated(turn_id, TokenUsage(3, 4, 7)))
                    events.append(TurnComplete(turn_id))
                entries = [
                    JournalEvent(i + 1, at + i, e)  # type: ignore[arg-type]
                    for i, e in enumerate(events)
                ]
                await store.import_events(s.thread_id, entries)

    anyio.run(main)


def read_journal(env: dict[str, str], thread_id: str) -> tuple[ThreadMetadata, list[JournalEvent]]:
    """Return a thread's metadata and every journal event, read through the store."""

    async def main() -> tuple[ThreadMetadata, list[JournalEvent]]:
        store = await JsonlThreadStoreFactory(base_path=store_base(env)).open()
        async with store:
            return await store.get_thread(thread_id), await store.read_events(thread_id)

    return anyio.run(main)


def tree(root: Path) -> dict[str, bytes | None]:
    """Return every path under ``root`` with its bytes (None for directories)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def roder_on_terminal(
    *args: str, env: dict[str, str], answer: str = "", stderr_terminal: bool = False
) -> tuple[int, str, str]:
    """Run ``roder`` with stdin (and optionally stderr) on a pseudo-terminal.

    ``answer`` is typed at once (the terminal holds it until the process reads a line);
    return the exit code, stdout, and what the process wrote to the terminal and stderr.
    """
    master, slave = pty.openpty()
    # A real terminal has a size; tqdm draws nothing on one that reports 0 columns.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    stderr_target: int = slave if stderr_terminal else subprocess.PIPE
    process = subprocess.Popen(
        [*roder_command(), *args],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=stderr_target,
        env=env,
    )
    os.close(slave)
    if answer:
        os.write(master, answer.encode())
    terminal = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the process closed the terminal
                    break
                if not chunk:
                    break
                terminal += chunk
            elif process.poll() is not None:
                break
        stdout, stderr = process.communicate(timeout=60)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
    shown = terminal.decode(errors="replace") + (stderr or b"").decode(errors="replace")
    return process.returncode, stdout.decode(), shown


def chat_turns(env: dict[str, str], *texts: str, args: Sequence[str] = ()) -> str:
    """Run ``roder chat`` once per text (piped stdin is one prompt) on one new thread.

    The first run creates the thread (its id is on stderr); the others continue it. Return
    the thread id.
    """
    thread_id: str | None = None
    for text in texts:
        extra = ["--thread", thread_id] if thread_id is not None else list(args)
        done = subprocess.run(
            [*roder_command(), "chat", *extra],
            input=text,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        if thread_id is None:
            thread_id = done.stderr.split("thread: ", 1)[1].split()[0]
    assert thread_id is not None
    return thread_id
