"""One holder per thread: a session holds the thread's lease, in this process and across
processes (real ones: ``roder chat`` and runtimes on JSONL, SQLite and PostgreSQL), and a
SIGKILLed holder frees the thread at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import BusyError, ThreadBusyError
from roder_api.events import TurnAborted, TurnComplete, TurnStarted
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadStore, ThreadStoreFactory
from roder_runtime import Runtime, UserInput

from .conftest import REPO, make_runtime, roder_command
from .postgres_support import require_postgres, temporary_schema
from .test_session_chat import finish, read_until, start_chat

CHILD = Path(__file__).with_name("_lease_child.py")


@pytest.mark.anyio
async def test_a_second_session_on_a_thread_is_refused_naming_the_holder(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id, owner="first holder") as session:
            assert session.lease is not None and session.lease.holder.pid == os.getpid()
            with pytest.raises(ThreadBusyError) as refused:
                await runtime.start_session(thread_id)
            assert isinstance(refused.value, BusyError)
            assert refused.value.holder is not None
            assert refused.value.holder.owner == "first holder"
            assert f"pid {os.getpid()}" in str(refused.value)
        # Closed: the thread is free again.
        async with runtime.start_session(thread_id) as again:
            await again.submit(UserInput("hi"))
            assert isinstance((await again.next_event()).event, TurnStarted)


# --- two `roder chat` processes ---------------------------------------------------------------


def test_a_second_roder_chat_on_a_thread_is_refused_and_the_first_goes_on(
    cli_env: dict[str, str],
) -> None:
    first = start_chat(cli_env, "--thread", "shared")
    assert first.stdin is not None
    seen = bytearray()
    try:
        read_until(first, b"thread: shared\n", seen)
        first.stdin.write(b"hello\n")
        first.stdin.flush()
        read_until(first, b"You said: hello\n", seen)
        second = subprocess.run(
            [*roder_command(), "chat", "--thread", "shared"],
            input=b"intruding\n",
            capture_output=True,
            env=cli_env,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        message = second.stderr.decode()
        assert "thread 'shared' is in use by roder chat" in message
        assert f"pid {first.pid}" in message and "Traceback" not in message
        # The first chat is unaffected.
        first.stdin.write(b"still here\n")
        first.stdin.close()
        code, stdout, stderr = finish(first, seen)
    finally:
        first.kill()
        first.wait(timeout=60)
        for stream in (first.stdout, first.stderr):
            if stream is not None:
                stream.close()
    assert code == 0, stderr
    assert "You said: still here" in stdout
    shown = subprocess.run(
        [*roder_command(), "replay", "shared", "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert "intruding" not in shown.stdout


def test_a_sigkilled_roder_chat_frees_its_thread(cli_env: dict[str, str]) -> None:
    first = start_chat(cli_env, "--thread", "dying")
    seen = bytearray()
    try:
        read_until(first, b"thread: dying\n", seen)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        for stream in (first.stdin, first.stdout, first.stderr):
            if stream is not None and not stream.closed:
                stream.close()
    after = subprocess.run(
        [*roder_command(), "chat", "--thread", "dying"],
        input=b"anyone?\n",
        capture_output=True,
        env=cli_env,
        timeout=60,
    )
    assert after.returncode == 0, after.stderr
    assert b"You said: anyone?" in after.stdout


# --- two runtimes in two processes, on every store -------------------------------------------


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Yield (kind, where) of a store two processes share."""
    kind = str(request.param)
    if kind == "jsonl":
        yield kind, str(tmp_path / "threads")
    elif kind == "sqlite":
        yield kind, str(tmp_path / "threads.sqlite3")
    else:
        dsn = require_postgres()
        with temporary_schema("roder_lease") as schema:
            yield kind, f"{dsn}#{schema}"


def store_factory(kind: str, where: str) -> ThreadStoreFactory:
    sys.path.insert(0, str(CHILD.parent))
    try:
        from _lease_child import factory
    finally:
        sys.path.pop(0)
    return factory(kind, where)


def start_holder(kind: str, where: str, thread_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), kind, where, thread_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def read_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line, child.stderr.read() if child.stderr else "no output"
    return line.strip()


@pytest.mark.anyio
async def test_two_runtimes_in_two_processes_hold_a_thread_one_at_a_time(
    shared_store: tuple[str, str],
) -> None:
    kind, where = shared_store
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(store_factory(kind, where))
    async with Runtime(builder.build()) as runtime:
        if type(await runtime.store()).lease is ThreadStore.lease:
            pytest.skip(f"the {kind} store has only the in-process lease of the base class")
        thread_id = (await runtime.create_thread()).thread_id
        holder = start_holder(kind, where, thread_id)
        try:
            assert await anyio.to_thread.run_sync(read_line, holder) == "holding"
            with pytest.raises(ThreadBusyError) as refused:
                await runtime.start_session(thread_id)
            assert refused.value.holder is not None
            assert refused.value.holder.pid == holder.pid
            assert refused.value.holder.owner == "lease-child"
            # The holder is unaffected and runs a turn.
            assert holder.stdin is not None
            holder.stdin.write("turn hello\n")
            holder.stdin.flush()
            assert await anyio.to_thread.run_sync(read_line, holder) == "done hello"
            # Killed, it frees the thread without anyone cleaning up.
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=60)
            deadline = time.monotonic() + 20
            while True:
                try:
                    session = await runtime.start_session(thread_id)
                    break
                except ThreadBusyError:
                    assert time.monotonic() < deadline, "the dead holder's lease was not freed"
                    await anyio.sleep(0.2)
            async with session:
                turn_id = await session.submit(UserInput("after"))
                with anyio.fail_after(20):
                    while True:
                        event = (await session.next_event()).event
                        if isinstance(event, (TurnComplete, TurnAborted)):
                            if event.turn_id == turn_id:
                                break
        finally:
            holder.kill()
            holder.wait(timeout=60)
            for stream in (holder.stdin, holder.stdout, holder.stderr):
                if stream is not None and not stream.closed:
                    stream.close()
        entries = (await runtime.event_page(thread_id, limit=10_000)).events
        assert [e.sequence for e in entries] == list(range(1, len(entries) + 1))
        completed = [e.event for e in entries if isinstance(e.event, TurnComplete)]
        assert [c.last_assistant_message for c in completed] == [
            "You said: hello",
            "You said: after",
        ]
