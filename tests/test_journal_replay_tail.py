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
