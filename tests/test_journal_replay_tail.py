"""A journal that replayed before reads only the events appended since.

A session replays its thread before every turn; the thread's history does not change
under it except by appends (the journal is append-only, numbered without gaps), so the
second replay reads the tail after the last event it saw (and that event itself, to
check that it is still the same journal) instead of the whole history: O(new events).
Whatever was appended meanwhile, by anyone, is in it; a compaction boundary in the tail
starts the history anew; a journal that is not the one seen is replayed whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import Event, ItemCompleted, JournalEvent
from roder_api.testing import MemoryThreadStore, MemoryThreadStoreFactory, ScriptedEngine
from roder_api.threads import ThreadMetadata
from roder_api.transcript import AssistantMessage, ContextCompaction, UserMessage
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


class CountingStore(MemoryThreadStore):
    """Counts the events each read returns."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.returned: list[int] = []

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        entries = await super().read_events(thread_id, after=after, limit=limit)
        self.returned.append(len(entries))
        return entries

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        entries = await super().replay_events(thread_id)
        self.returned.append(len(entries))
        return entries


def said(turn: str, *texts: str) -> list[Event]:
    return [ItemCompleted(turn, UserMessage(t)) for t in texts]


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine())
    builder.thread_store_factory(MemoryThreadStoreFactory(store_class=CountingStore))
    runtime = Runtime(builder.build(), RuntimeConfig())
    try:
        yield runtime
    finally:
        await runtime.aclose()


async def new_thread(runtime: Runtime, thread_id: str = "t1") -> tuple[CountingStore, Any]:
    """Create the thread; return the store and one journal of it (``Runtime.journal``)."""
    store = await runtime.store()
    assert isinstance(store, CountingStore)
    await store.create_thread(ThreadMetadata(thread_id, 0, 0))
    return store, await runtime.journal(thread_id)


async def test_a_second_replay_reads_only_the_tail(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await journal.append(said("a", *(f"m{i}" for i in range(50))))
    first = await journal.replay_history()
    assert len(first) == 50 and first.sequence == 50
    # Appended by someone else (no session, no lease: a script, another process).
    await store.append_events("t1", [ItemCompleted("b", AssistantMessage("reply"))])
    store.returned.clear()
    second = await journal.replay_history()
    assert store.returned == [2]  # the last event seen, then the new one
    assert [*second] == [*first, AssistantMessage("reply")]
    assert second.sequence == 51
    assert len(first) == 50  # a replay handed out is never changed afterwards


async def test_nothing_new_reads_one_event_and_returns_the_same_history(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await journal.append(said("a", "one", "two"))
    first = await journal.replay_history()
    store.returned.clear()
    again = await journal.replay_history()
    assert store.returned == [1]
    assert [*again] == [*first] and again.sequence == first.sequence
    again.append(UserMessage("changed by its caller"))
    assert [*await journal.replay_history()] == [*first]


async def test_a_boundary_in_the_tail_starts_the_history_anew(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await journal.append(said("a", "one", "two"))
    await journal.replay_history()
    summary = ContextCompaction("they said one and two")
    await store.append_events("t1", [ItemCompleted("c", summary), *said("d", "three")])
    history = await journal.replay_history()
    assert [*history] == [summary, UserMessage("three")]
    assert [*history] == [*await (await runtime.journal("t1")).replay_history()]


async def test_a_journal_that_is_not_the_one_seen_is_replayed_whole(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await journal.append(said("a", "one", "two"))
    await journal.replay_history()
    await store.delete_thread("t1")
    await store.create_thread(ThreadMetadata("t1", 0, 0))
    await store.append_events("t1", said("z", "other", "history", "here"))
    history = await journal.replay_history()
    assert [*history] == [UserMessage("other"), UserMessage("history"), UserMessage("here")]


async def test_an_empty_journal_then_appends(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    assert [*await journal.replay_history()] == []
    await journal.append(said("a", "one"))
    history = await journal.replay_history()
    assert [*history] == [UserMessage("one")] and history.sequence == 1


async def test_a_read_of_the_end_serves_the_replay_just_after(runtime: Runtime) -> None:
    # A following session reads what others journaled (read_events) just before its turn
    # replays: that one read serves both.
    store, journal = await new_thread(runtime)
    await journal.append(said("a", "m0", "m1"))
    assert len(await journal.replay_history()) == 2
    await store.append_events("t1", said("b", "elsewhere"))  # another process's append
    store.returned.clear()
    unread = await journal.read_events(after=2)
    history = await journal.replay_history()
    assert [e.sequence for e in unread] == [3]
    assert store.returned == [2]  # one read: from the last event the replay saw
    assert [m.text for m in history] == ["m0", "m1", "elsewhere"] and history.sequence == 3


async def test_a_first_replay_after_a_read_from_the_start(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await store.append_events("t1", said("a", "m0", "m1"))
    store.returned.clear()
    assert len(await journal.read_events(after=0)) == 2
    history = await journal.replay_history()
    assert store.returned == [2] and [m.text for m in history] == ["m0", "m1"]


async def test_an_append_since_the_read_makes_the_replay_read_again(runtime: Runtime) -> None:
    store, journal = await new_thread(runtime)
    await journal.append(said("a", "m0"))
    await journal.replay_history()
    await journal.read_events(after=1)
    await journal.append(said("a", "m1"))  # through this journal: the read is stale
    store.returned.clear()
    history = await journal.replay_history()
    assert store.returned == [2] and [m.text for m in history] == ["m0", "m1"]


async def test_a_read_serves_only_one_replay_and_only_while_fresh(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from roder_runtime.store import _journal

    store, journal = await new_thread(runtime)
    await journal.append(said("a", "m0"))
    await journal.replay_history()
    await journal.read_events(after=1)
    await journal.replay_history()  # served by the read
    store.returned.clear()
    await journal.replay_history()  # the read was used: this one reads
    assert store.returned == [1]
    monkeypatch.setattr(_journal, "TAIL_FRESH_S", -1.0)
    await journal.read_events(after=1)
    await store.append_events("t1", said("b", "late"))  # after the read went stale
    store.returned.clear()
    history = await journal.replay_history()
    assert store.returned == [2] and [m.text for m in history] == ["m0", "late"]
