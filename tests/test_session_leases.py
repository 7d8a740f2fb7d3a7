"""One holder per thread: a session holds the thread's lease, in this process and across
processes (real ones: ``roder chat`` and runtimes on JSONL, SQLite and PostgreSQL), and a
SIGKILLed holder frees the thread at once."""

from __future__ import annotations

import json
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
from .installed_roder import Terminal
from .postgres_support import require_postgres, temporary_schema
from .test_session_chat import terminal_env

CHILD = Path(__file__).with_name("_lease_child.py")


def create_cli_thread(env: dict[str, str], thread_id: str) -> None:
    """Create ``thread_id`` in the store the ``roder`` command of ``env`` uses."""

    async def create() -> None:
        async with make_runtime(Path(env["RODER_HOME"]) / "threads") as runtime:
            await runtime.create_thread(thread_id)

    anyio.run(create)


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
    create_cli_thread(cli_env, "shared")
    first = Terminal(roder_command(), "chat", "--thread", "shared", env=terminal_env(cli_env))
    try:
        first.read_until("you>")
        first.type("hello\r")
        first.read_until("You said: hello[\\s\\S]*you>")  # the session holds the lease
        second = subprocess.run(
            [*roder_command(), "chat", "--thread", "shared"],
            input=b"intruding\n",
            capture_output=True,
            env=cli_env,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        message = second.stderr.decode()
        assert "thread shared is in use by roder chat" in message
        assert f"pid {first.process.pid}" in message and "Traceback" not in message
        # The first chat is unaffected.
        first.type("still here\r")
        first.read_until("You said: still here")
        first.type("/exit\r")
        code = first.wait()
        shown = first.text()
    finally:
        first.close()
    assert code == 0, shown
    replayed = subprocess.run(
        [*roder_command(), "threads", "show", "shared", "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    )
    turns = json.loads(replayed.stdout)["turns"]
    texts = [item["text"] for turn in turns for item in turn["items"]]
    assert texts == ["hello", "You said: hello", "still here", "You said: still here"]
    events = subprocess.run(
        [*roder_command(), "threads", "show", "shared", "--events", "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    )
    assert "intruding" not in events.stdout


def test_a_sigkilled_roder_chat_frees_its_thread(cli_env: dict[str, str]) -> None:
    create_cli_thread(cli_env, "dying")
    first = Terminal(roder_command(), "chat", "--thread", "dying", env=terminal_env(cli_env))
    try:
        first.read_until("you>")
        first.type("are you there?\r")
        first.read_until("You said: are you there\\?[\\s\\S]*you>")  # the lease is held
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=60)
    finally:
        first.close()
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


@pytest.fixture(params=["jsonl", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
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
