"""The writer lock is a flock on the journal itself: who waits for whom, across processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from jsonl_helpers import start_script

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._locks import APPEND, HAVE_FLOCK, ProcessLock, lock_existing

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not HAVE_FLOCK, reason="flock semantics (POSIX)"),
]


@pytest.fixture
def anyio_backend() -> str:
    # Processes are the subject here; one event loop is enough.
    return "asyncio"


HOLDER = textwrap.dedent(
    """
    import sys
    from roder_jsonl_thread_store._locks import ProcessLock

    with ProcessLock(sys.argv[1]):
        print("holding", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    """
)


def hold(path: Path) -> subprocess.Popen[str]:
    """Start a process that holds the writer lock of the journal at ``path`` until told."""
    return start_script(HOLDER, str(path), ready="holding")


def release(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "released"
    child.stdin.close()
    child.stdout.close()
    assert child.wait(timeout=30) == 0


def item(text: str) -> ItemCompleted:
    return ItemCompleted("t", UserMessage(text))


async def test_a_create_makes_the_journal_and_no_other_file(tmp_path: Path) -> None:
    base = tmp_path / "store"
    store = await JsonlThreadStoreFactory(base).open()
    await store.create_thread(ThreadMetadata("only", 1, 1))
    await store.append_events("only", [item("a")])
    await store.aclose()
    made = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
    assert [p for p in made if not p.startswith("index.sqlite3")] == ["threads/only.jsonl"]


@pytest.mark.parametrize("durability", ["group", "fsync"])
async def test_an_append_waits_for_another_process_holding_the_journal(
    tmp_path: Path, durability: str
) -> None:
    base = tmp_path / "store"
    store = await JsonlThreadStoreFactory(base, durability=durability).open()
    await store.create_thread(ThreadMetadata("held", 1, 1))
    child = hold(store.journal_path("held"))
    done = anyio.Event()

    async def append() -> None:
        await store.append_events("held", [item("after the holder")])
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(append)
        await anyio.sleep(0.5)
        assert not done.is_set()  # the other process holds the journal's lock
        await anyio.to_thread.run_sync(release, child)
        with anyio.fail_after(30):
            await done.wait()
    assert [e.sequence for e in await store.read_events("held")] == [1]
    await store.aclose()


async def test_a_create_waits_while_another_process_excludes_writers_of_the_missing_journal(
    tmp_path: Path,
) -> None:
    base = tmp_path / "store"
    store = await JsonlThreadStoreFactory(base).open()
    await store.create_thread(ThreadMetadata("first", 1, 1))  # the directories exist
    child = hold(store.journal_path("new"))  # no journal yet: the directory is held
    done = anyio.Event()

    async def create() -> None:
        await store.create_thread(ThreadMetadata("new", 2, 2))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(create)
        await anyio.sleep(0.5)
        assert not done.is_set()
        assert not store.journal_path("new").exists()
        await anyio.to_thread.run_sync(release, child)
        with anyio.fail_after(30):
            await done.wait()
    assert (await store.get_thread("new")).created_at_ms == 2
    await store.aclose()


def test_a_waiter_locks_the_journal_that_replaced_the_one_it_waited_for(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    journal.write_bytes(b"old\n")
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(b"new\n")
    got: list[int | None] = []
    lock = ProcessLock(journal)
    with lock:
        waiter = threading.Thread(target=lambda: got.append(lock_existing(journal, APPEND)))
        waiter.start()
        time.sleep(0.3)
        assert not got  # flock conflicts between descriptors of one process too
        os.replace(replacement, journal)  # as a repair or a delete and create would
    waiter.join(timeout=30)
    (fd,) = got
    assert fd is not None
    try:
        assert os.fstat(fd).st_ino == os.stat(journal).st_ino
        os.write(fd, b"appended\n")
    finally:
        os.close(fd)
    assert journal.read_bytes() == b"new\nappended\n"


def test_a_waiter_finds_no_journal_when_the_holder_deleted_it(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    journal.write_bytes(b"old\n")
    got: list[int | None] = []
    with ProcessLock(journal):
        waiter = threading.Thread(target=lambda: got.append(lock_existing(journal, APPEND)))
        waiter.start()
        time.sleep(0.2)
        journal.unlink()
    waiter.join(timeout=30)
    assert got == [None]
    assert not journal.exists()  # nothing was made


CREATOR = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import ItemCompleted
    from roder_api.threads import ThreadMetadata
    from roder_api.transcript import UserMessage
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    base, name, durability = sys.argv[1:4]

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base, durability=durability).open()
        for i in range(100000):
            thread_id = f"{name}-{i}"
            await store.create_thread(ThreadMetadata(thread_id, 1, 1))
            print("created", thread_id, flush=True)
            await store.append_events(thread_id, [ItemCompleted("t", UserMessage(str(i)))])
            print("appended", thread_id, flush=True)

    anyio.run(main)
    """
)


def kill_creators(base: Path, durability: str) -> tuple[set[str], set[str]]:
    """SIGKILL creating children at random moments; return what they acknowledged."""
    rng = random.Random(13)
    created: set[str] = set()
    appended: set[str] = set()
    for round_ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", CREATOR, str(base), f"r{round_}", durability],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.8 + rng.random() * 0.6)  # the interpreter starts in ~0.5 s
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate(timeout=30)
        # Only whole lines are acknowledgements: the kill can cut the last one mid-write.
        for line in out.split("\n")[:-1]:
            what, _, thread_id = line.partition(" ")
            (created if what == "created" else appended).add(thread_id)
    return created, appended


@pytest.mark.parametrize("durability", ["group", "none"])
async def test_creators_killed_at_random_moments_leave_complete_threads_and_no_held_lock(
    tmp_path: Path, durability: str
) -> None:
    base = tmp_path / "store"
    created, appended = await anyio.to_thread.run_sync(kill_creators, base, durability)
    assert appended, "no child got as far as an append"
    store = await JsonlThreadStoreFactory(base, durability=durability).open()
    on_disk = set(await store.journal_ids())
    assert created <= on_disk  # every acknowledged create survived
    listed = set()
    cursor = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=500)
        listed |= {m.thread_id for m in page.threads}
        cursor = page.next_cursor
        if cursor is None:
            break
    assert listed == on_disk  # the index caught up with the killed creators
    for thread_id in sorted(on_disk):
        check = await store.check_thread(thread_id)
        assert check.damage is None, (thread_id, check.damage)  # no journal half made
        events = await store.read_events(thread_id)
        if thread_id in appended:
            assert [e.sequence for e in events] == [1]  # the acknowledged append survived
        else:
            assert len(events) <= 1
        # Nobody holds its lock: it takes a write at once.
        with anyio.fail_after(10):
            await store.append_events(thread_id, [item("after")])
    await store.aclose()
