"""The docs' compaction snippet is not racy: a compaction commits only on the sequence its
history was read at, so items appended between ``replay_history`` and
``compact_with_provider`` are never hidden by a boundary (JSONL, SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import CompactionPreempted
from roder_api.events import CompactionCommitted, CompactionDiscarded
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadStoreFactory
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime import Runtime, RuntimeConfig

from .postgres_support import STORE_KINDS, store_factory_of

pytestmark = pytest.mark.anyio


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadStoreFactory]:
    """Return a factory of each real store kind (PostgreSQL in a throwaway schema)."""
    with store_factory_of(request.param, tmp_path, "roder_cmp_read") as factory:
        yield factory


@pytest.fixture
async def runtime(store_factory: ThreadStoreFactory) -> AsyncIterator[Runtime]:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(store_factory)
    async with Runtime(builder.build(), RuntimeConfig()) as rt:
        yield rt


async def seeded(runtime: Runtime) -> str:
    thread_id = (await runtime.create_thread()).thread_id
    await runtime.persist_turn_item(thread_id, "t1", UserMessage("hello"))
    await runtime.persist_turn_item(thread_id, "t1", AssistantMessage("hi"))
    return thread_id


async def test_an_item_appended_after_the_history_was_read_is_never_hidden(
    runtime: Runtime,
) -> None:
    thread_id = await seeded(runtime)
    history = await runtime.replay_history(thread_id)  # the docs' snippet
    late = UserMessage("written by another worker after the read")
    await runtime.persist_turn_item(thread_id, "t2", late)
    with pytest.raises(CompactionPreempted) as caught:
        await runtime.compact_with_provider(thread_id, "t9", "scripted", None, history)
    assert caught.value.reason == "conflict"
    assert await runtime.replay_history(thread_id) == [*history, late]
    events = [e.event for e in (await runtime.event_page(thread_id, limit=100)).events]
    assert not any(isinstance(e, CompactionCommitted) for e in events)
    assert events[-1] == CompactionDiscarded("conflict", "t9")


async def test_a_history_given_as_a_plain_list_is_checked_against_the_thread(
    runtime: Runtime,
) -> None:
    thread_id = await seeded(runtime)
    history = list(await runtime.replay_history(thread_id))  # no read sequence with it
    await runtime.persist_turn_item(thread_id, "t2", UserMessage("late"))
    with pytest.raises(CompactionPreempted) as caught:
        await runtime.compact_with_provider(thread_id, "t9", "scripted", None, history)
    assert caught.value.reason == "conflict"
    # The same list, now current: it commits.
    current = list(await runtime.replay_history(thread_id))
    result = await runtime.compact_with_provider(thread_id, "t9", "scripted", None, current)
    assert await runtime.replay_history(thread_id) == [result.boundary]


async def test_replay_history_says_the_sequence_it_was_read_at(runtime: Runtime) -> None:
    thread_id = await seeded(runtime)
    history = await runtime.replay_history(thread_id)
    assert history.sequence == (await runtime.get_thread(thread_id)).last_sequence == 2
    result = await runtime.compact_with_provider(thread_id, "t9", "scripted", None, history)
    assert await runtime.replay_history(thread_id) == [result.boundary]
