"""The event recorder on a real JSONL store: persisted before delivered, bounded, coalescing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from roder_api.errors import RecorderError, StoreError
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    Event,
    JournalEvent,
    ModelStepStarted,
    WarningEvent,
)
from roder_api.storekit import FollowOn
from roder_api.threads import ThreadMetadata
from roder_jsonl_thread_store import JsonlThreadStore
from roder_runtime.session import _recorder
from roder_runtime.session._recorder import COALESCE_BYTES, EventRecorder

pytestmark = [pytest.mark.anyio, pytest.mark.core]

FINAL = ContentPhase.FINAL_ANSWER
REASONING = ContentPhase.REASONING


class FailingStore(JsonlThreadStore):
    """A real JSONL store whose appends start failing after ``ok_appends`` calls."""

    def __init__(self, base_path: Path, ok_appends: int) -> None:
        super().__init__(base_path)
        self.ok_appends = ok_appends
        self.appends = 0

    async def append_events(self, thread_id: str, events: Sequence[Event]) -> list[JournalEvent]:
        self.appends += 1
        if self.appends > self.ok_appends:
            raise StoreError("disk on fire")
        return await super().append_events(thread_id, events)


async def new_thread(store: JsonlThreadStore, thread_id: str = "t") -> str:
    await store.create_thread(ThreadMetadata(thread_id, 0, 0))
    return thread_id


@asynccontextmanager
async def running(
    store: JsonlThreadStore,
    thread_id: str,
    *,
    capacity: int = 512,
    budget: int = 8 * 1024 * 1024,
    coalesce_seconds: float = 0.040,
) -> AsyncIterator[EventRecorder]:
    async def append(events: Sequence[Event]) -> list[JournalEvent]:
        return await store.append_events(thread_id, events)

    recorder = EventRecorder(
        append, event_capacity=capacity, byte_budget=budget, coalesce_seconds=coalesce_seconds
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(recorder.run)
        try:
            yield recorder
        finally:
            recorder.discard_undelivered()
            recorder.close()


def delta(text: str, step: str = "s1", phase: ContentPhase = FINAL) -> AssistantContentDelta:
    return AssistantContentDelta("turn", step, phase, text)


async def drain(recorder: EventRecorder, count: int) -> list[JournalEvent]:
    with anyio.fail_after(10):
        return [await recorder.next_event() for _ in range(count)]


async def test_an_event_is_persisted_before_it_is_delivered(jsonl_store: JsonlThreadStore) -> None:
    thread_id = await new_thread(jsonl_store)
    async with running(jsonl_store, thread_id) as recorder:
        for i in range(20):
            recorder.record(WarningEvent(f"w{i}"))
        for i in range(20):
            with anyio.fail_after(10):
                entry = await recorder.next_event()
            assert entry.event == WarningEvent(f"w{i}")
            page = await jsonl_store.event_page(thread_id, limit=100)
            assert entry in page.events
        # What queued up while a write was in flight went out in fewer appends.
        assert recorder.batches < 20


async def test_full_by_count_refuses_and_keeps_everything_accepted(
    jsonl_store: JsonlThreadStore,
) -> None:
    thread_id = await new_thread(jsonl_store)
    async with running(jsonl_store, thread_id, capacity=5) as recorder:
        for i in range(5):
            recorder.record(WarningEvent(f"w{i}"))
        with pytest.raises(RecorderError) as refused:
            recorder.record(WarningEvent("one too many"))
        assert str(refused.value) == "event recorder queue is full"
        # Deltas are refused too, even the first of a stream.
        with pytest.raises(RecorderError, match="^event recorder queue is full$"):
            recorder.record(delta("x"))
        entries = await drain(recorder, 5)
        assert [e.event for e in entries] == [WarningEvent(f"w{i}") for i in range(5)]
        with anyio.fail_after(10):
            await recorder.flush()
        # Delivery made room again.
        recorder.record(WarningEvent("after"))
        assert (await drain(recorder, 1))[0].event == WarningEvent("after")
    journal = await jsonl_store.read_events(thread_id)
    assert [e.event.message for e in journal] == [  # type: ignore[union-attr]
        *(f"w{i}" for i in range(5)),
        "after",
    ]


async def test_full_by_bytes_refuses_and_keeps_everything_accepted(
    jsonl_store: JsonlThreadStore,
) -> None:
    thread_id = await new_thread(jsonl_store)
    big = "x" * 1000
    async with running(jsonl_store, thread_id, capacity=100, budget=3600) as recorder:
        for i in range(3):
            recorder.record(WarningEvent(f"{i}{big}"))
        with pytest.raises(RecorderError, match="^event recorder queue is full$"):
            recorder.record(WarningEvent(f"3{big}"))
        # Pending text counts against the budget as well.
        recorder.record(delta("a"))
        recorder.record(delta("b" * 200))
        with pytest.raises(RecorderError, match="^event recorder queue is full$"):
            recorder.record(delta("c" * 300))
        # An event larger than the whole budget is refused while anything else is held.
        with pytest.raises(RecorderError, match="^event recorder queue is full$"):
            recorder.record(WarningEvent("y" * 4000))
        with anyio.fail_after(10):
            flushed = anyio.Event()

            async def flush() -> None:
                await recorder.flush()
                flushed.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(flush)
                entries = await drain(recorder, 5)
        assert flushed.is_set()
        # ... and accepted alone, so that it cannot be stuck for ever.
        recorder.record(WarningEvent("y" * 4000))
        with pytest.raises(RecorderError, match="^event recorder queue is full$"):
            recorder.record(WarningEvent("z"))
        assert (await drain(recorder, 1))[0].event == WarningEvent("y" * 4000)
    entries.append((await jsonl_store.read_events(thread_id))[-1])
    assert [e.event for e in entries] == [
        *(WarningEvent(f"{i}{big}") for i in range(3)),
        delta("a"),
        delta("b" * 200),
        WarningEvent("y" * 4000),
    ]
    assert [e.event for e in await jsonl_store.read_events(thread_id)] == [e.event for e in entries]


async def test_a_failing_store_stops_delivery_and_flush_raises(tmp_path: Path) -> None:
    store = FailingStore(tmp_path / "threads", ok_appends=1)
    (tmp_path / "threads" / "threads").mkdir(parents=True)
    (tmp_path / "threads" / "locks").mkdir()
    (tmp_path / "threads" / "tmp").mkdir()
    thread_id = await new_thread(store)
    async with running(store, thread_id) as recorder:
        recorder.record(WarningEvent("kept"))
        first = await drain(recorder, 1)
        assert first[0].event == WarningEvent("kept")
        recorder.record(WarningEvent("lost"))
        with anyio.fail_after(10), pytest.raises(RecorderError) as failed:
            await recorder.flush()
        assert isinstance(failed.value.__cause__, StoreError)
        assert "disk on fire" in str(failed.value)
        with pytest.raises(RecorderError):
            await recorder.next_event()
        with pytest.raises(RecorderError):
            recorder.record(WarningEvent("refused"))
    assert [e.event for e in await store.read_events(thread_id)] == [WarningEvent("kept")]


async def test_a_burst_of_one_character_deltas_is_coalesced(jsonl_store: JsonlThreadStore) -> None:
    thread_id = await new_thread(jsonl_store)
    text = "".join(chr(ord("a") + i % 26) for i in range(2048))
    async with running(jsonl_store, thread_id) as recorder:
        for char in text:
            recorder.record(delta(char))
        recorder.record(WarningEvent("end"))
        delivered: list[JournalEvent] = []
        while not delivered or not isinstance(delivered[-1].event, WarningEvent):
            delivered += await drain(recorder, 1)
    deltas = [e.event.delta for e in delivered if isinstance(e.event, AssistantContentDelta)]
    assert "".join(deltas) == text
    assert 1 < len(deltas) < 2048
    assert deltas[0] == "a"  # the first delta of a stream goes out at once


async def test_barriers_flush_pending_text_first(jsonl_store: JsonlThreadStore) -> None:
    thread_id = await new_thread(jsonl_store)
    events: list[Event] = [
        delta("r1", phase=REASONING),
        delta("r2", phase=REASONING),
        delta("r3", phase=REASONING),
        delta("f1"),  # phase change
        delta("f2"),
        delta("f3"),
        ModelStepStarted("turn", "s2"),  # any other event
        delta("g1", step="s2"),
        delta("g2", step="s2"),
        delta("h1", step="s3"),  # step change
        delta("h2", step="s3"),
    ]
    async with running(jsonl_store, thread_id, coalesce_seconds=30) as recorder:
        for event in events:
            recorder.record(event)
        with anyio.fail_after(10):
            await recorder.wait_persisted()  # forces the last pending text out
        entries = await drain(recorder, 9)
    assert [e.event for e in entries] == [
        delta("r1", phase=REASONING),
        delta("r2r3", phase=REASONING),
        delta("f1"),
        delta("f2f3"),
        ModelStepStarted("turn", "s2"),
        delta("g1", step="s2"),
        delta("g2", step="s2"),
        delta("h1", step="s3"),
        delta("h2", step="s3"),
    ]


async def test_first_delta_goes_out_at_once_and_a_timer_flushes_a_quiet_stream(
    jsonl_store: JsonlThreadStore,
) -> None:
    thread_id = await new_thread(jsonl_store)
    async with running(jsonl_store, thread_id) as recorder:
        recorder.record(delta("first"))
        with anyio.fail_after(10):
            assert (await recorder.next_event()).event == delta("first")
        recorder.record(delta("second"))
        recorder.record(delta(" third"))
        # Nothing else arrives: the 40 ms timer sends the pending text on its own.
        with anyio.fail_after(10):
            assert (await recorder.next_event()).event == delta("second third")


async def test_text_that_ends_a_batch_skips_the_gather_pass(
    jsonl_store: JsonlThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch takes one pass of the event loop first, so that what the ready tasks record
    joins it; not when text ends it (a reader waits for a stream's first token)."""
    passes: list[int] = []

    async def one_pass() -> None:
        passes.append(len(passes))
        await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(_recorder, "_ONE_PASS", one_pass)
    thread_id = await new_thread(jsonl_store)
    async with running(jsonl_store, thread_id) as recorder:
        assert recorder.gather is one_pass
        recorder.record(delta("first"))
        assert (await drain(recorder, 1))[0].event == delta("first")
        assert passes == []  # text ended the batch: taken at once
        warning = WarningEvent("careful", "turn")
        recorder.record(warning)
        assert (await drain(recorder, 1))[0].event == warning
        assert passes == [0]  # any other event: one pass first


async def test_what_a_follow_on_was_offered_and_did_not_journal_goes_in_the_next_batch(
    jsonl_store: JsonlThreadStore,
) -> None:
    """A store call that closes the FollowOn without taking what it was offered (a store
    without the one-call path: PostgreSQL, one in memory, a wrapper): those events are
    appended next, in order, not lost."""
    thread_id = await new_thread(jsonl_store)
    appended: list[list[Event]] = []
    recorder: EventRecorder | None = None

    async def append(events: Sequence[Event]) -> list[JournalEvent]:
        appended.append(list(events))
        if len(appended) == 1:
            assert recorder is not None
            recorder.record(WarningEvent("queued before the store call"))
            follow_on = FollowOn()
            assert recorder.follow(follow_on)  # offered what was queued...
            recorder.record(WarningEvent("recorded during it"))
            follow_on.close()  # ...and the store took none of it
        return await jsonl_store.append_events(thread_id, events)

    recorder = EventRecorder(append, event_capacity=64, byte_budget=1 << 20)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(recorder.run)
        recorder.record(WarningEvent("first"))
        got = await drain(recorder, 3)
        recorder.close()
    said = ["first", "queued before the store call", "recorded during it"]
    assert [entry.event.message for entry in got] == said  # type: ignore[attr-defined]
    assert [entry.sequence for entry in got] == [1, 2, 3]
    assert recorder.failure is None
    assert [len(batch) for batch in appended] == [1, 2]


async def test_large_deltas_pass_whole(jsonl_store: JsonlThreadStore) -> None:
    thread_id = await new_thread(jsonl_store)
    multibyte = "é" * (COALESCE_BYTES // 2)  # exactly 16 KiB of UTF-8 in 8 Ki characters
    over = "x" * (COALESCE_BYTES + 1)
    assert len(multibyte.encode()) == COALESCE_BYTES
    sent = ["a", multibyte, "b", over, "c", "d", multibyte]
    async with running(jsonl_store, thread_id, coalesce_seconds=30) as recorder:
        for text in sent:
            recorder.record(delta(text))
        with anyio.fail_after(10):
            await recorder.wait_persisted()
        delivered = [e.event.delta for e in await drain(recorder, 6)]  # type: ignore[union-attr]
    assert "".join(delivered) == "".join(sent)
    assert multibyte in delivered and over in delivered
    for text in delivered:
        # Each delivered delta is whole provider deltas: never a split one.
        assert len(text.encode()) <= COALESCE_BYTES or text == over
    assert delivered == ["a", multibyte, "b", over, "cd", multibyte]
