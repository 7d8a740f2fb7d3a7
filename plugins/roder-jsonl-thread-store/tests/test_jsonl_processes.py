"""The JSONL store across real processes: concurrent writers, dead lock holders, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from jsonl_helpers import start_script

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._format import parse_line

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # Processes are the subject here; one event loop is enough.
    return "asyncio"


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    import anyio
    from roder_api.events import ItemCompleted
    from roder_api.transcript import UserMessage
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    base, thread_id, name, count, durability, mode = sys.argv[1:7]

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base, durability=durability).open()
        if mode == "hold":
            def hold(_thread_id: str) -> None:
                print("holding", flush=True)
                time.sleep(3600)
            store._after_journal_write = hold
        elif mode == "die":
            store._after_journal_write = lambda _t: os.kill(os.getpid(), signal.SIGKILL)
        print("ready", flush=True)
        sys.stdin.readline()  # start together
        for i in range(int(count)):
            item = ItemCompleted("turn", UserMessage(f"{name} {i}"))
            await store.append_events(thread_id, [item])
        await store.aclose()

    anyio.run(main)
    """
)


def spawn(
    base: Path, thread_id: str, name: str, count: int, durability: str, mode: str
) -> subprocess.Popen[str]:
    return start_script(
        CHILD, str(base), thread_id, name, str(count), durability, mode, ready="ready"
    )


def start(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()


async def make_thread(base: Path, thread_id: str, at: int = 1000) -> None:
    store = await JsonlThreadStoreFactory(base).open()
    await store.create_thread(ThreadMetadata(thread_id, at, at))
    await store.aclose()


@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_two_processes_appending_to_one_thread_interleave_cleanly(
    tmp_path: Path, durability: str
) -> None:
    base = tmp_path / "store"
    await make_thread(base, "shared")
    count = 400 if durability == "none" else 150
    children = [spawn(base, "shared", name, count, durability, "run") for name in ("a", "b")]
    for child in children:
        start(child)
    for child in children:
        child.communicate(timeout=100)
        assert child.returncode == 0
    path = base / "threads" / "shared.jsonl"
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [parse_line(line) for line in lines[:-1]]  # every line intact (checksums hold)
    sequences = [r["seq"] for r in records if r["k"] == "events"]
    assert sequences == list(range(1, 2 * count + 1))
    store = await JsonlThreadStoreFactory(base).open()
    events = await store.read_events("shared")
    assert [e.sequence for e in events] == list(range(1, 2 * count + 1))
    for name in ("a", "b"):
        mine = [e.event.item.text for e in events if e.event.item.text.startswith(name)]
        assert mine == [f"{name} {i}" for i in range(count)]  # each writer's order kept
    meta = await store.get_thread("shared")
    assert meta.item_count == 2 * count and meta.last_sequence == 2 * count
    await store.aclose()


async def test_a_lock_held_by_a_killed_process_does_not_block(tmp_path: Path) -> None:
    base = tmp_path / "store"
    await make_thread(base, "locked")
    child = spawn(base, "locked", "dead", 1, "fsync", "hold")
    start(child)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "holding"  # it holds the thread's lock now
    store = await JsonlThreadStoreFactory(base).open()
    done = anyio.Event()
    appended: list[int] = []

    async def append() -> None:
        got = await store.append_events("locked", [ItemCompleted("t", UserMessage("mine"))])
        appended.extend(e.sequence for e in got)
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(append)
        await anyio.sleep(0.5)
        assert not done.is_set()  # serialised behind the live holder
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
        with anyio.fail_after(10):
            await done.wait()
    # The holder's line was synced before it died: it keeps sequence 1.
    assert appended == [2]
    events = await store.read_events("locked")
    assert [e.event.item.text for e in events] == ["dead 0", "mine"]
    await store.aclose()


async def test_the_index_survives_a_kill_between_journal_write_and_index_update(
    tmp_path: Path,
) -> None:
    base = tmp_path / "store"
    await make_thread(base, "older", at=1000)
    await make_thread(base, "crashy", at=2000)
    watcher = await JsonlThreadStoreFactory(base).open()  # open before the crash
    assert [m.thread_id for m in (await watcher.list_threads()).threads] == ["crashy", "older"]
    # The child appends to "older", syncs the journal and is SIGKILLed before the index update.
    child = spawn(base, "older", "lost", 1, "fsync", "die")
    start(child)
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    sessions = list((base / "sessions").glob("*.session"))
    assert len(sessions) == 1  # the dead writer's marker stays behind
    store = await JsonlThreadStoreFactory(base).open()
    page = await store.list_threads()
    assert [m.thread_id for m in page.threads] == ["older", "crashy"]
    assert page.threads[0].item_count == 1 and page.threads[0].last_sequence == 1
    assert not list((base / "sessions").glob("*.session"))  # caught up, marker removed
    # A store that was open during the crash sees the caught-up index too.
    assert [m.thread_id for m in (await watcher.list_threads()).threads] == ["older", "crashy"]
    await store.aclose()
    await watcher.aclose()


async def test_a_dead_writers_torn_tail_is_cut_when_the_thread_is_next_used(
    tmp_path: Path,
) -> None:
    base = tmp_path / "store"
    await make_thread(base, "t")
    store = await JsonlThreadStoreFactory(base).open()
    await store.append_events("t", [ItemCompleted("t", UserMessage("kept"))])
    path = store.journal_path("t")
    # What a writer killed mid-write leaves.
    path.write_bytes(path.read_bytes() + b'{"c":"0000')
    started = time.monotonic()
    fresh = await JsonlThreadStoreFactory(base).open()
    assert [
        e.sequence
        for e in await fresh.append_events("t", [ItemCompleted("t", UserMessage("next"))])
    ] == [2]
    assert time.monotonic() - started < 10
    assert [e.event.item.text for e in await fresh.read_events("t")] == ["kept", "next"]
    await store.aclose()
    await fresh.aclose()
