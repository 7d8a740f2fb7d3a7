"""Journal descriptors kept open between commits: unlocked meanwhile, never stale, never forked."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._locks import HAVE_FLOCK

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not HAVE_FLOCK, reason="flock semantics (POSIX)"),
]


@pytest.fixture
def anyio_backend() -> str:
    # Processes are the subject here; one event loop is enough.
    return "asyncio"


def item(text: str) -> ItemCompleted:
    return ItemCompleted("t", UserMessage(text))


TRY_LOCK = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy")
    else:
        print("free")
    """
)


def lock_state(path: Path) -> str:
    """Return what another process finds the journal's writer lock: ``free`` or ``busy``."""
    done = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("durability", ["group", "fsync"])
async def test_between_commits_another_process_can_lock_the_journal(
    tmp_path: Path, durability: str
) -> None:
    store = await JsonlThreadStoreFactory(tmp_path / "s", durability=durability).open()
    await store.create_thread(ThreadMetadata("t1", 1, 1))
    for n in range(3):
        await store.append_events("t1", [item(f"a{n}")])
        assert await anyio.to_thread.run_sync(lock_state, store.journal_path("t1")) == "free"
    await store.aclose()


REPLACE = textwrap.dedent(
    """
    import sys, anyio
    from pathlib import Path
    from roder_api.events import ItemCompleted
    from roder_api.threads import ThreadMetadata
    from roder_api.transcript import UserMessage
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    async def main() -> None:
        store = await JsonlThreadStoreFactory(Path(sys.argv[1])).open()
        await store.delete_thread("t1")
        await store.create_thread(ThreadMetadata("t1", 7, 7))
        await store.append_events("t1", [ItemCompleted("t", UserMessage("theirs"))])
        await store.aclose()

    anyio.run(main)
    """
)


async def test_an_append_after_another_process_replaced_the_journal_lands_in_the_new_one(
    tmp_path: Path,
) -> None:
    base = tmp_path / "s"
    store = await JsonlThreadStoreFactory(base).open()
    await store.create_thread(ThreadMetadata("t1", 1, 1))
    for n in range(3):
        await store.append_events("t1", [item(f"old{n}")])  # the journal's descriptor is kept
    await anyio.to_thread.run_sync(
        lambda: subprocess.run([sys.executable, "-c", REPLACE, str(base)], check=True, timeout=60)
    )
    (entry,) = await store.append_events("t1", [item("mine")])
    assert entry.sequence == 2  # after the other process's one item, not the old journal's 3
    assert (await store.get_thread("t1")).created_at_ms == 7
    texts = [e.event.item.text for e in await store.read_events("t1")]  # type: ignore[attr-defined]
    assert texts == ["theirs", "mine"]
    await store.aclose()


async def test_a_thread_deleted_here_is_not_written_through_its_kept_descriptor(
    tmp_path: Path,
) -> None:
    store = await JsonlThreadStoreFactory(tmp_path / "s").open()
    await store.create_thread(ThreadMetadata("t1", 1, 1))
    await store.append_events("t1", [item("old")])
    await store.delete_thread("t1")
    await store.create_thread(ThreadMetadata("t1", 2, 2))
    (entry,) = await store.append_events("t1", [item("new")])
    assert entry.sequence == 1
    assert b"new" in store.journal_path("t1").read_bytes()
    await store.aclose()


FORK = textwrap.dedent(
    """
    import os, sys
    from roder_jsonl_thread_store._locks import KeptJournals

    path = sys.argv[1]
    kept = KeptJournals()
    fd, st = kept.lock(path)
    os.write(fd, b"parent\\n")
    kept.release(path, fd, st, keep=True)  # kept open (and registered with the fork guard)
    pid = os.fork()
    if pid == 0:
        fd, st = kept.lock(path)
        os.write(fd, b"child\\n")
        kept.release(path, fd, st, keep=True)
        kept.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    fd, st = kept.lock(path)
    os.write(fd, b"parent again\\n")
    kept.release(path, fd, st, keep=True)
    kept.close()
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_opens_the_journal_anew_and_its_writes_land(tmp_path: Path) -> None:
    # The fork guard puts /dev/null in place of the kept descriptor in the child: a write
    # through it would vanish. The child must notice the fork and open the journal itself.
    journal = tmp_path / "j.jsonl"
    journal.write_bytes(b"")
    subprocess.run([sys.executable, "-c", FORK, str(journal)], check=True, timeout=60)
    assert journal.read_bytes() == b"parent\nchild\nparent again\n"


def descriptors_on(path: Path) -> int:
    """Return how many of this process's descriptors are open on the file at ``path``."""
    target = os.stat(path)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/self/fd/{name}")
            count += (st.st_ino, st.st_dev) == (target.st_ino, target.st_dev)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")
async def test_a_new_journal_is_kept_open_unlocked_for_its_first_append(tmp_path: Path) -> None:
    """The create hands its descriptor to the kept journals: the first append opens
    nothing (fails when the create closes it), and another process can lock it meanwhile."""
    store = await JsonlThreadStoreFactory(tmp_path / "s").open()
    await store.create_thread(ThreadMetadata("t1", 1, 1))
    path = store.journal_path("t1")
    assert descriptors_on(path) == 1
    assert await anyio.to_thread.run_sync(lock_state, path) == "free"
    await store.append_events("t1", [item("first")])
    assert descriptors_on(path) == 1  # the same one, used again
    assert [e.event for e in await store.read_events("t1")] == [item("first")]
    await store.aclose()
    assert descriptors_on(path) == 0
