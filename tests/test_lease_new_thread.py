"""A new thread's lease and create in one worker call (the kit's stores with file leases).

``Runtime.start_session(create=True)`` makes its thread with ``lease_new_thread``; on the
JSONL and SQLite stores the file lock and the create are one worker call (one hand-off to a
worker thread and back), where taking the lease first was a call of its own. Real stores.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from roder_api.errors import StoreError, ThreadBusyError
from roder_api.events import ItemCompleted
from roder_api.storekit import BlockingThreadStore, FollowOn
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


@pytest.fixture(params=["jsonl", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    factory: Any = (
        JsonlThreadStoreFactory(base_path=tmp_path / "threads")
        if request.param == "jsonl"
        else SqliteThreadStoreFactory(path=tmp_path / "threads.db")
    )
    opened = await factory.open()
    assert isinstance(opened, BlockingThreadStore)
    yield opened
    await opened.aclose()


def worker_calls(monkeypatch: pytest.MonkeyPatch, store: BlockingThreadStore) -> list[str]:
    """Return the list the names of the store's worker calls (``run_sync``) go in."""
    calls: list[str] = []
    run_sync = store.run_sync

    async def counted(func: Any, *args: Any) -> Any:
        calls.append(getattr(func, "__name__", repr(func)))
        return await run_sync(func, *args)

    monkeypatch.setattr(store, "run_sync", counted)
    return calls


async def test_the_lease_and_the_create_are_one_worker_call(
    store: BlockingThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = worker_calls(monkeypatch, store)
    first = [ItemCompleted("t1", UserMessage("hello"))]
    async with store.lease_new_thread(ThreadMetadata("made", 1, 1), first, owner="me") as made:
        assert calls == ["lease_and_create"]
        assert [entry.event for entry in made.entries] == first
    # Alone, the same work is two calls: the lease's, then the create's.
    calls.clear()
    async with store.lease("other", owner="me"):
        await store.create_thread_with_events(ThreadMetadata("other", 1, 1), first)
    assert len(calls) >= 1 and "lease_and_create" not in calls


def _said(text: str) -> ItemCompleted:
    return ItemCompleted("t1", UserMessage(text))


async def test_events_offered_to_the_follow_on_are_journaled_in_the_same_worker_call(
    store: BlockingThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What came before the worker started joins the create's write; what came while it
    made the thread is one append after it, in the same call; then offers are refused."""
    calls = worker_calls(monkeypatch, store)
    create = store.create_with_follow_on_sync
    made_with: list[int] = []

    def create_then_offer(metadata: ThreadMetadata, events: Any, payloads: Any, f: Any) -> Any:
        made_with.append(len(events))
        made = create(metadata, events, payloads, f)
        assert follow_on.offer(_said("while made"))  # as the event loop would, meanwhile
        return made

    monkeypatch.setattr(store, "create_with_follow_on_sync", create_then_offer)
    follow_on = FollowOn()
    assert follow_on.offer(_said("before"))
    first = [_said("first")]
    metadata = ThreadMetadata("made", 1, 1)
    async with store.lease_new_thread(metadata, first, owner="me", follow_on=follow_on) as made:
        assert calls == ["lease_and_create"]
        assert made_with == [2]  # the first event and the one offered before
        texts = [entry.event.item.text for entry in made.entries]  # type: ignore[attr-defined]
        assert texts == ["first", "before", "while made"]
        assert [entry.sequence for entry in made.entries] == [1, 2, 3]
        assert not follow_on.open and not follow_on.offer(_said("too late"))
        assert follow_on.error is None
    journaled = await store.read_events("made")
    assert [entry.event for entry in journaled] == [entry.event for entry in made.entries]
    assert (await store.get_thread("made")).last_sequence == 3


async def test_a_failed_follow_on_append_leaves_the_thread_and_its_lease(
    store: BlockingThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    create = store.create_with_follow_on_sync

    def create_then_offer(metadata: ThreadMetadata, events: Any, payloads: Any, f: Any) -> Any:
        made = create(metadata, events, payloads, f)
        assert follow_on.offer(_said("while made"))
        return made

    def failing_append(*args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "create_with_follow_on_sync", create_then_offer)
    monkeypatch.setattr(store, "append_sync", failing_append)
    follow_on = FollowOn()
    metadata = ThreadMetadata("made", 1, 1)
    async with store.lease_new_thread(
        metadata, [_said("first")], owner="me", follow_on=follow_on
    ) as made:
        assert isinstance(follow_on.error, OSError)
        assert [entry.sequence for entry in made.entries] == [1]
        with pytest.raises(ThreadBusyError):  # the lease is held all the same
            async with store.lease("made", owner="other"):
                pass
    monkeypatch.undo()
    assert [entry.sequence for entry in await store.read_events("made")] == [1]


async def test_without_the_one_call_path_the_follow_on_takes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JSONL only: its lease works without file_leases(); the SQLite store's needs them.
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    assert isinstance(store, BlockingThreadStore)
    monkeypatch.setattr(store, "file_leases", lambda: None)  # as a store without file leases
    follow_on = FollowOn()
    assert follow_on.offer(_said("offered"))
    metadata = ThreadMetadata("made", 1, 1)
    async with store.lease_new_thread(
        metadata, [_said("first")], owner="me", follow_on=follow_on
    ) as made:
        assert [entry.sequence for entry in made.entries] == [1]
        assert not follow_on.offer(_said("later"))
    assert (await store.get_thread("made")).last_sequence == 1
    await store.aclose()


class OfferedWhileMade(FollowOn):
    """Offers ``texts`` as the event loop would while the thread is made: when the store
    takes a second time (the first is the kit's, as the worker call starts)."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts, self.takes = texts, 0

    def take(self) -> Any:
        self.takes += 1
        if self.takes == 2:
            for text in self.texts:
                assert self.offer(_said(text))
        return super().take()


def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Return the list every file and directory sync from now on goes in, in order (its
    kind and the name it has then; Linux)."""
    import roder_jsonl_thread_store._core as core

    order: list[str] = []
    for owner, name in ((os, "fsync"), (os, "fdatasync"), (core, "datasync")):
        real = getattr(owner, name)

        def sync(fd: int, real: Any = real) -> None:
            kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            order.append(f"{kind} {os.path.basename(os.readlink(f'/proc/self/fd/{fd}'))}")
            real(fd)

        monkeypatch.setattr(owner, name, sync)
    return order


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names descriptors by /proc")
async def test_jsonl_journals_what_came_while_the_journal_was_made_in_the_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is offered once the new journal is linked is written then and synced with it,
    before the directory is: no append of its own after the create (one filesystem journal
    commit fewer on the way to a new conversation's first token)."""
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    assert isinstance(store, BlockingThreadStore)

    def no_append(*args: Any) -> Any:
        raise AssertionError("appended after the create")

    monkeypatch.setattr(store, "append_sync", no_append)
    follow_on = OfferedWhileMade("while made 1", "while made 2")
    order = synced(monkeypatch)
    metadata = ThreadMetadata("made", 1, 1)
    async with store.lease_new_thread(
        metadata, [_said("first")], owner="me", follow_on=follow_on
    ) as made:
        assert follow_on.takes == 2 and follow_on.error is None
        texts = [entry.event.item.text for entry in made.entries]  # type: ignore[attr-defined]
        assert texts == ["first", "while made 1", "while made 2"]
        assert [entry.sequence for entry in made.entries] == [1, 2, 3]
        # The new file with its first line, then it with what followed (the same file, by
        # the name it was made with), then the directory its name is in.
        mine = [name.split(".")[0] for name in order if name.startswith(("file made.", "dir th"))]
        assert mine == ["file made", "file made", "dir threads"], order
    monkeypatch.undo()
    assert [entry.event for entry in await store.read_events("made")] == [
        entry.event for entry in made.entries
    ]
    assert (await store.get_thread("made")).last_sequence == 3
    # The next append goes on from there.
    await store.append_events("made", [_said("next")])
    assert [entry.sequence for entry in await store.read_events("made")] == [1, 2, 3, 4]
    await store.aclose()


async def test_jsonl_a_failed_write_of_what_followed_leaves_the_thread_as_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    assert isinstance(store, BlockingThreadStore)
    import roder_jsonl_thread_store._writer as jsonl_writer

    real_write = jsonl_writer.write_all

    def torn_write(fd: int, data: bytes) -> None:
        if follow_on.takes < 2:  # the journal's first lines: written as usual
            real_write(fd, data)
            return
        real_write(fd, data[: len(data) // 2])  # a part lands, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonl_writer, "write_all", torn_write)
    follow_on = OfferedWhileMade("while made")
    metadata = ThreadMetadata("made", 1, 1)
    async with store.lease_new_thread(
        metadata, [_said("first")], owner="me", follow_on=follow_on
    ) as made:
        assert isinstance(follow_on.error, StoreError)
        assert "No space left on device" in str(follow_on.error)
        assert [entry.sequence for entry in made.entries] == [1]
        assert not follow_on.offer(_said("later"))  # refused: the rest goes after, or not
        with pytest.raises(ThreadBusyError):  # the lease is held all the same
            async with store.lease("made", owner="other"):
                pass
    monkeypatch.undo()
    # Cut back: no torn line behind the first events, and the journal goes on.
    assert [entry.sequence for entry in await store.read_events("made")] == [1]
    assert (await store.check_thread("made")).ok
    await store.append_events("made", [_said("next")])
    assert [entry.sequence for entry in await store.read_events("made")] == [1, 2]
    await store.aclose()
