"""A new thread's index row is written like an append's, deferred by at most the flush
interval: listed at once in the process that made it, soon in others, and after a SIGKILL
right behind the create the next opener catches the index up from the journal."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import textwrap
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from jsonl_helpers import start_script

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._core import INDEX_FLUSH_INTERVAL_S

pytestmark = [pytest.mark.anyio, pytest.mark.core]

CREATE_THEN = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    from roder_api.threads import ThreadMetadata
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    base, then = sys.argv[1:3]

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base).open()
        for index in range(5):
            await store.create_thread(ThreadMetadata(f"t{index}", 1000, 1000, title="x"))
        print("created", flush=True)
        if then == "kill":  # before the deferred rows' flush: they are lost with us
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.readline()  # stay open (and the rows' flush due) until told
        await store.aclose()

    anyio.run(main)
    """
)


def _start(base: Path, then: str) -> subprocess.Popen[str]:
    return start_script(CREATE_THEN, str(base), then, ready="created")


async def _listed(base: Path) -> set[str]:
    store = await JsonlThreadStoreFactory(base).open()
    try:
        return {t.thread_id for t in (await store.list_threads(limit=100)).threads}
    finally:
        await store.aclose()


async def test_listed_at_once_where_it_was_made(tmp_path: Path, anyio_backend: str) -> None:
    store = await JsonlThreadStoreFactory(tmp_path).open()
    try:
        made = await store.create_thread(ThreadMetadata("here", 1000, 1000, title="t"))
        page = await store.list_threads(limit=10)
        assert [(t.thread_id, t.title) for t in page.threads] == [("here", "t")]
        assert made.thread_id == "here"
    finally:
        await store.aclose()


async def test_another_process_lists_new_threads_soon(tmp_path: Path, anyio_backend: str) -> None:
    proc = _start(tmp_path, "wait")
    try:
        deadline = time.monotonic() + 10
        listed: set[str] = set()
        while time.monotonic() < deadline:
            listed = await _listed(tmp_path)
            if len(listed) == 5:
                break
            await anyio.sleep(0.01)
        assert listed == {f"t{i}" for i in range(5)}
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


async def test_a_kill_right_after_create_loses_no_thread(
    tmp_path: Path, anyio_backend: str
) -> None:
    proc = _start(tmp_path, "kill")
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert os.listdir(tmp_path / "threads")  # the journals are there
    assert await _listed(tmp_path) == {f"t{i}" for i in range(5)}


async def test_a_late_deferred_row_never_replaces_a_newer_one(
    tmp_path: Path, anyio_backend: str
) -> None:
    """Two stores on one directory (two processes' worth): A's deferred row of an older
    state, written after B's row of the newer one, must not put the index back."""
    a = await JsonlThreadStoreFactory(tmp_path, durability="group").open()
    b = await JsonlThreadStoreFactory(tmp_path, durability="group").open()
    try:
        await a.create_thread(ThreadMetadata("t", 1000, 1000))
        await anyio.sleep(2 * INDEX_FLUSH_INTERVAL_S)
        await a.append_events("t", [ItemCompleted("turn", UserMessage("a 1"))])  # written now
        await a.append_events("t", [ItemCompleted("turn", UserMessage("a 2"))])  # deferred
        # B's first row is written at once: the newest, before A's deferred one.
        await b.append_events("t", [ItemCompleted("turn", UserMessage("b 1"))])
        await anyio.sleep(10 * INDEX_FLUSH_INTERVAL_S)  # A's deferred flush has run
    finally:
        await a.aclose()
        await b.aclose()
    with closing(sqlite3.connect(tmp_path / "index.sqlite3")) as db:
        (size,) = db.execute("SELECT size FROM threads WHERE thread_id = 't'").fetchone()
    assert size == (tmp_path / "threads" / "t.jsonl").stat().st_size
