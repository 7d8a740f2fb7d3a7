"""A lease is not inherited by a child its holder forked: after SIGKILL of the holder, while
the forked child (a tool's background job, which inherited every descriptor) still runs,
the thread is free — JSONL, SQLite and PostgreSQL."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.transcript import UserMessage
from roder_runtime import Runtime

from ._lease_child import factory
from .conftest import REPO
from .postgres_support import require_postgres, temporary_schema

CHILD = Path(__file__).with_name("_fork_holder_child.py")

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "jsonl":
        yield "jsonl", str(tmp_path / "threads")
    elif request.param == "sqlite":
        yield "sqlite", str(tmp_path / "threads.sqlite3")
    else:
        dsn = require_postgres()
        with temporary_schema("roder_fork") as schema:
            yield "postgres", f"{dsn}#{schema}"


def runtime_on(kind: str, where: str) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory(kind, where))
    return Runtime(builder.build(), name="taker")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def said(process: anyio.abc.Process, word: str) -> list[str]:
    """Return the words of the first line ``process`` prints, which must start with ``word``."""
    assert process.stdout is not None
    output = b""
    with anyio.fail_after(60):
        while not output.endswith(b"\n"):
            output += await process.stdout.receive()
    line = output.decode().split()
    assert line[:1] == [word], line
    return line


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


async def test_a_forked_child_does_not_keep_the_lease_of_a_killed_holder(
    store: tuple[str, str],
) -> None:
    kind, where = store
    async with runtime_on(kind, where) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
    child_pid = 0
    async with await anyio.open_process(
        [sys.executable, str(CHILD), kind, where, thread_id], cwd=REPO
    ) as holder:
        try:
            line = await said(holder, "holding")
            child_pid = int(line[2])
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
            assert alive(child_pid)  # the background job runs on, descriptors and all
            if kind == "jsonl":
                # The holder's liveness marker says "dead" while its child runs: the next
                # store catches the index up from the journals it may have left behind.
                markers = list((Path(where) / "sessions").glob("*.session"))
                assert markers, "the holder wrote: it has a liveness marker"
                for marker in markers:
                    assert lock_is_free(marker), f"{marker.name} is still locked"
            async with runtime_on(kind, where) as runtime:
                with anyio.fail_after(20):
                    async with runtime.start_session(thread_id) as session:
                        assert session.lease is not None
                        assert session.lease.holder.owner == "taker"
            assert alive(child_pid)  # taken while the child still ran
        finally:
            if holder.returncode is None:
                holder.kill()
            if child_pid and alive(child_pid):
                os.kill(child_pid, signal.SIGKILL)


APPENDER = Path(__file__).with_name("_fork_appender_child.py")


async def test_children_forked_while_a_writer_commits_do_not_keep_the_thread_locked(
    store: tuple[str, str],
) -> None:
    # A tool's background job may fork at any moment, also while the store's worker thread
    # holds what a commit locks (the JSONL journal's writer lock). SIGKILL the writer: the
    # children run on, and another writer's append must still go through.
    kind, where = store
    async with runtime_on(kind, where) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
    children: list[int] = []
    async with await anyio.open_process(
        [sys.executable, str(APPENDER), kind, where, thread_id, "40"], cwd=REPO
    ) as writer:
        try:
            line = await said(writer, "forked")
            children = [int(pid) for pid in line[1:]]
            os.kill(writer.pid, signal.SIGKILL)
            await writer.wait()
            assert all(alive(pid) for pid in children)
            async with runtime_on(kind, where) as runtime:
                with anyio.fail_after(20):
                    await runtime.persist_turn_item(thread_id, "turn-2", UserMessage("after"))
                    items = [
                        i for t in (await runtime.load_thread(thread_id)).turns for i in t.items
                    ]
                assert items[-1] == UserMessage("after")
            assert all(alive(pid) for pid in children)  # written while they all ran
        finally:
            if writer.returncode is None:
                writer.kill()
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
