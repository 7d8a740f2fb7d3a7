"""``ThreadStore.create_thread_with_events`` under SIGKILL: a thread never exists without its
first events, and every create the writer was told had happened is there.

A real child process creates threads with three events each, one after another, printing
each id once its create returned; the parent kills it (SIGKILL) at a random point, then
opens the store and reads every thread there is (JSONL: every journal file, listed or not).
The same for a new thread made under its lease with two events following in the same
worker call (``BlockingThreadStore.lease_new_thread``'s ``follow_on``), offered every other
thread while it is made (JSONL: written once the journal is linked) and else as the call
finishes (an append): a thread holds its three first events or all five, never four. And
JSONL killed at two set points inside that create, once its journal is linked: before
what followed is written, and after (before its sync).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from roder_api.threads import ThreadStore
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHILD = r"""
import sys, anyio
from pathlib import Path
from roder_api.events import ItemCompleted, TurnComplete, TurnStarted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from roder_api.storekit import FollowOn

class Offering(FollowOn):
    # Offers two events as the event loop would meanwhile: "early", when the store takes
    # while it makes the thread (JSONL: once the journal is linked, before its directory is
    # synced); else, or where no store takes then, as the worker call finishes (an append).
    def __init__(self, early):
        super().__init__()
        self.early, self.takes, self.offered = early, 0, False

    def _offer(self):
        if not self.offered:
            self.offered = True
            for text in ("followed 1", "followed 2"):
                self.offer(ItemCompleted("t", UserMessage(text * 40)))

    def take(self):
        self.takes += 1
        if self.takes == 2 and self.early:
            self._offer()
        return super().take()

    def close(self):
        self._offer()
        return super().close()

async def main(kind, path, mode):
    factory = (JsonlThreadStoreFactory(base_path=Path(path)) if kind == "jsonl"
               else SqliteThreadStoreFactory(path=path))
    store = await factory.open()
    following = []
    for i in range(100000):
        thread_id = f"made{i}"
        first = [TurnStarted("t"), ItemCompleted("t", UserMessage("hello " * 50)),
                 TurnComplete("t")]
        metadata = ThreadMetadata(thread_id, 1, 1)
        following.append(Offering(early=i % 2 == 0))
        if mode == "create":
            await store.create_thread_with_events(metadata, first)
        else:
            async with store.lease_new_thread(
                metadata, first, owner="child", follow_on=following[-1]
            ) as made:
                assert len(made.entries) == 5 and following[-1].error is None
        print(thread_id, flush=True)

anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
"""


def kill_while_creating(kind: str, path: str, seed: int, mode: str = "create") -> list[str]:
    """Run the child until a random number of creates returned, SIGKILL it mid-loop;
    return the ids it said were made."""
    rng = random.Random(seed)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, path, mode], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    acked: list[str] = []
    target = rng.randint(3, 40)
    while len(acked) < target:
        line = child.stdout.readline()
        assert line, "the child ended before it was killed"
        acked.append(line.strip())
    time.sleep(rng.random() * 0.003)  # somewhere inside a later create
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    acked += [line.strip() for line in child.stdout.read().splitlines() if line.strip()]
    child.stdout.close()
    return acked


async def every_thread(store: ThreadStore) -> set[str]:
    found: set[str] = set()
    cursor = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=500)
        found.update(t.thread_id for t in page.threads)
        cursor = page.next_cursor
        if cursor is None:
            break
    if isinstance(store, JsonlThreadStore):
        found.update(await store.journal_ids())  # listed or not
    return found


async def read_all(kind: str, path: str) -> tuple[set[str], dict[str, int]]:
    """Return every thread of the store and how many events each holds."""
    factory = (
        JsonlThreadStoreFactory(base_path=Path(path))
        if kind == "jsonl"
        else SqliteThreadStoreFactory(path=path)
    )
    async with await factory.open() as store:
        found = await every_thread(store)
        return found, {t: len(await store.read_events(t)) for t in found}


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_a_killed_create_leaves_the_thread_whole_or_absent(tmp_path: Path, kind: str) -> None:
    killed_inside = 0
    for trial in range(6):
        path = str(tmp_path / f"{kind}{trial}" / ("store.sqlite3" if kind == "sqlite" else ""))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        acked = kill_while_creating(kind, path, seed=trial)

        found, counts = anyio.run(read_all, kind, path)
        assert set(acked) <= found, f"trial {trial}: acknowledged creates lost"
        assert all(n == 3 for n in counts.values()), f"trial {trial}: {counts}"
        killed_inside += len(found) > len(acked)  # made, not yet acknowledged
    # Not an assertion on luck: the trials are what they are; say what they covered.
    print(f"{kind}: {killed_inside} of 6 kills landed after a create was durable, unsaid")


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_a_killed_create_with_a_follow_on_leaves_its_first_events_or_all(
    tmp_path: Path, kind: str
) -> None:
    between = 0
    for trial in range(6):
        path = str(tmp_path / f"{kind}{trial}" / ("store.sqlite3" if kind == "sqlite" else ""))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        acked = kill_while_creating(kind, path, seed=trial, mode="follow")

        found, counts = anyio.run(read_all, kind, path)
        assert set(acked) <= found, f"trial {trial}: acknowledged creates lost"
        assert all(counts[thread] == 5 for thread in acked), f"trial {trial}: {counts}"
        assert all(n in (3, 5) for n in counts.values()), f"trial {trial}: {counts}"
        between += sum(n == 3 for n in counts.values())
    # Not an assertion on luck: say what the kills covered.
    print(f"{kind}: {between} of 6 kills landed between a create and what followed it")


KILLED_INSIDE = r"""
import os, signal, sys, anyio
from pathlib import Path
from roder_api.events import ItemCompleted, TurnComplete, TurnStarted
from roder_api.storekit import FollowOn
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
import roder_jsonl_thread_store._writer as jsonl_writer

def die():
    os.kill(os.getpid(), signal.SIGKILL)

class Offering(FollowOn):
    # Offers two events when the store takes while it makes the thread (once the journal
    # is linked); with "linked" the process dies right there, before they are written.
    def __init__(self):
        super().__init__()
        self.takes = 0

    def take(self):
        self.takes += 1
        if self.takes == 2:
            for text in ("followed 1", "followed 2"):
                self.offer(ItemCompleted("t", UserMessage(text)))
            if sys.argv[2] == "linked":
                die()
            taken.append(True)
        return super().take()

real_write = jsonl_writer.write_all
taken = []

def write_then_die(fd, data):  # "written": dies once they are written, before the sync
    real_write(fd, data)
    if taken:
        die()

async def main(path):
    store = await JsonlThreadStoreFactory(base_path=Path(path)).open()
    if sys.argv[2] == "written":
        jsonl_writer.write_all = write_then_die
    first = [TurnStarted("t"), ItemCompleted("t", UserMessage("hello")), TurnComplete("t")]
    async with store.lease_new_thread(
        ThreadMetadata("made", 1, 1), first, owner="child", follow_on=Offering()
    ):
        print("returned", flush=True)

anyio.run(main, sys.argv[1])
"""


@pytest.mark.parametrize(("moment", "events"), [("linked", 3), ("written", 5)])
def test_a_kill_inside_the_create_once_its_journal_is_linked(
    tmp_path: Path, moment: str, events: int
) -> None:
    """JSONL: SIGKILL inside the create, after the new journal is linked and before its
    directory is synced: before what followed was written (the thread holds its three first
    events) or after (all five, unsynced, in the page cache a killed process leaves). Either
    way the journal is whole (fsck finds nothing), its lease free, and it goes on."""
    child = subprocess.run(
        [sys.executable, "-c", KILLED_INSIDE, str(tmp_path), moment],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "returned" not in child.stdout  # it died inside the create

    async def check() -> None:
        from roder_api.events import ItemCompleted
        from roder_api.transcript import UserMessage

        async with await JsonlThreadStoreFactory(base_path=tmp_path).open() as store:
            assert await store.journal_ids() == ["made"]
            assert len(await store.read_events("made")) == events
            assert (await store.check_thread("made")).ok
            async with store.lease("made", owner="after"):  # the dead holder's is free
                await store.append_events("made", [ItemCompleted("t2", UserMessage("on"))])
            sequences = [entry.sequence for entry in await store.read_events("made")]
            assert sequences == list(range(1, events + 2))

    anyio.run(check)
