"""A streamed response's fold: live appends handed over in memory (no store read per append),
and still the exact events of the journal, in order, when appends come from another process
(real JSONL stores on disk; a second store object on the same directory stands for one)."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from serve_support import CountedReads

from roder_api import ExtensionRegistryBuilder
from roder_api.events import Event, JournalEvent
from roder_api.inference import Completed, MessageDelta, TokenUsage, Usage
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadMetadata, ThreadStore
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_server.openai._fold import AppendFeed, fold_response
from roder_server.openai._projection import ResponseProjection

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every test under asyncio and under trio."""
    return str(request.param)


async def _one_turn(path: Path, words: int) -> list[Event]:
    """Return the events a real session journals for one streamed turn of ``words`` deltas."""
    script = [MessageDelta(f"w{i} ") for i in range(words)]
    engine = ScriptedEngine(turns=[[*script, Usage(TokenUsage(3, 2, 5, 0)), Completed("stop")]])
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    async with Runtime(builder.build(), RuntimeConfig()) as rt:
        thread_id = (await rt.create_thread()).thread_id
        await rt.run_turn(thread_id, "hi", turn_id="turn_one")
        page = await rt.event_page(thread_id, limit=10_000)
    return [entry.event for entry in page.events]


def _thread() -> ThreadMetadata:
    now = int(time.time() * 1000)
    return ThreadMetadata("th", now, now)


async def _collect(store: ThreadStore, into: list[dict[str, Any]], started: anyio.Event) -> None:
    projection = ResponseProjection("th", "turn_one", "scripted/scripted-1")
    async for event in fold_response(store, projection, follow=True):
        into.append(event)
        started.set()


def _expected(journal: list[JournalEvent]) -> list[dict[str, Any]]:
    projection = ResponseProjection("th", "turn_one", "scripted/scripted-1")
    out = projection.feed_all(journal)
    assert projection.done
    return out


async def test_a_live_response_is_folded_without_reading_each_append(tmp_path: Path) -> None:
    events = await _one_turn(tmp_path / "source", 30)
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        await store.append_events("th", events[:1])
        counted = CountedReads(store)
        got: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            started = anyio.Event()
            tg.start_soon(_collect, store, got, started)
            with anyio.fail_after(30):
                await started.wait()  # the first read folded the turn's start
                reads_before_live = counted.reads
                for event in events[1:]:
                    await store.append_events("th", [event])
                    await anyio.lowlevel.checkpoint()
        journal = await store.read_events("th")
        assert got == _expected(journal), "every event once, in order, as a replay folds it"
        # Live appends were handed over in memory: main read the store after each of them.
        assert counted.reads - reads_before_live <= 2
    finally:
        await store.aclose()


async def test_appends_by_another_process_are_read_in_order(tmp_path: Path) -> None:
    events = await _one_turn(tmp_path / "source", 20)
    here = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    there = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await here.create_thread(_thread())
        got: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect, here, got, anyio.Event())
            with anyio.fail_after(60):
                for i, event in enumerate(events):
                    # Interleaved: appends here are handed over; there's are not (a gap).
                    await (here if i % 3 else there).append_events("th", [event])
                    if i % 5 == 0:
                        await anyio.sleep(0.02)
        assert got == _expected(await here.read_events("th"))
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_response_created_here_is_folded_without_any_read(tmp_path: Path) -> None:
    events = await _one_turn(tmp_path / "source", 10)
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        counted = CountedReads(store)
        feed = AppendFeed(store, "th")  # before the thread exists, as create_response does
        await store.create_thread(_thread())
        await store.append_events("th", events[:3])  # the run's start, before the stream
        projection = ResponseProjection("th", "turn_one", "scripted/scripted-1")
        got: list[dict[str, Any]] = []

        async def collect() -> None:
            async for event in fold_response(store, projection, follow=True, feed=feed):
                got.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            with anyio.fail_after(30):
                for event in events[3:]:
                    await store.append_events("th", [event])
                    await anyio.lowlevel.checkpoint()
        assert got == _expected(await store.read_events("th"))
        assert counted.reads == 1, "only the check above read the journal"
    finally:
        await store.aclose()


async def test_a_feed_nobody_holds_is_not_kept_alive_by_the_store(tmp_path: Path) -> None:
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        feed = AppendFeed(store, "th")  # a response whose stream never started
        gone = weakref.ref(feed)
        del feed
        gc.collect()
        assert gone() is None
        await store.append_events("th", (await _one_turn(tmp_path / "source", 1))[:1])
    finally:
        await store.aclose()


async def test_a_feed_says_where_a_turn_starts_or_that_it_cannot(tmp_path: Path) -> None:
    # A response on an existing conversation folds from just before its turn's first
    # event, as handed over to the feed when its input was journaled (no metadata read).
    from roder_api.events import InputAccepted, TurnStarted
    from roder_server.openai._params import turn_start as _turn_start

    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        await store.append_events("th", [InputAccepted(f"old{i}", "x") for i in range(300)])
        kept = {"openai_response": {"model": "m"}}
        await store.append_events("th", [TurnStarted("old10", {"openai_response": {"model": "n"}})])
        await store.append_events("th", [TurnStarted("old20")])
        feed = AppendFeed(store, "th")
        await store.append_events("th", [InputAccepted("other", "y", metadata=kept)])
        await store.append_events("th", [TurnStarted("mine"), TurnStarted("other")])
        assert feed.first_of("mine") == 304 and feed.first_of("other") == 303
        assert feed.first_of("nobody") is None
        # Read back from the journal's end when the feed cannot say (pages of 256): the
        # turn's first event is the one with its parameters, else its InputAccepted (a
        # turn queued behind others started long after), else its earliest.
        assert await _turn_start(store, "th", "mine") == (304, {})
        assert await _turn_start(store, "th", "other") == (303, {"model": "m"})
        assert await _turn_start(store, "th", "old10") == (301, {"model": "n"})
        assert await _turn_start(store, "th", "old20") == (21, {})
        assert await _turn_start(store, "th", "nobody") is None
        feed.take([])  # an append whose entries were not said: stale
        assert feed.first_of("mine") is None
        feed.close()
    finally:
        await store.aclose()


async def test_the_entries_at_hand_are_folded_as_one_batch(tmp_path: Path) -> None:
    # A stream writes each batch at once: the events before the first delta (created, in
    # progress, the item and part added, the delta) go out together, not a send each.
    from roder_server.openai._fold import fold_batches

    events = await _one_turn(tmp_path / "source", 10)
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        feed = AppendFeed(store, "th")
        await store.create_thread(_thread())
        for event in events[:4]:  # handed over one append at a time, before the fold runs
            await store.append_events("th", [event])
        projection = ResponseProjection("th", "turn_one", "scripted/scripted-1")
        batches: list[list[dict[str, Any]]] = []

        async def collect() -> None:
            async for batch in fold_batches(store, projection, follow=True, feed=feed):
                batches.append(batch)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            with anyio.fail_after(30):
                await store.append_events("th", events[4:])
        first = [event["type"] for event in batches[0]]
        assert first[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in first  # four appends' events in one batch
        flat = [event for batch in batches for event in batch]
        assert flat == _expected(await store.read_events("th"))
    finally:
        await store.aclose()
