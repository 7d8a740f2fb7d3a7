"""Sessions under back-pressure: coalesced bursts, slow consumers, a saturated recorder."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api.errors import StoppedError
from roder_api.events import (
    AssistantContentDelta,
    ErrorEvent,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import (
    Completed,
    MessageDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.testing import ScriptedEngine
from roder_api.transcript import (
    AssistantMessage,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)
from roder_runtime import RuntimeConfig, UserInput

from .conftest import make_runtime
from .session_support import events_until, journal, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_burst_of_2048_deltas_arrives_coalesced_with_the_same_text(
    tmp_path: Path,
) -> None:
    text = "".join(chr(0x41 + i % 50) for i in range(2048))
    engine = ScriptedEngine(turns=[[*(MessageDelta(c) for c in text), Completed()]])
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("burst"))
            seen = await events_until(session)
        deltas = [e for e in seen if isinstance(e.event, AssistantContentDelta)]
        assert text_of(seen) == text
        assert len(deltas) < 2048
        assert seen[-1].event == TurnComplete(turn_id, text)  # type: ignore[arg-type]


async def test_flush_waits_for_a_slow_consumer(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            await session.submit(UserInput("hello"))
            await anyio.sleep(0.2)  # the turn ran; nobody has read anything
            flushed = anyio.Event()

            async def flush() -> None:
                await session.flush()
                flushed.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(flush)
                await anyio.sleep(0.1)
                assert not flushed.is_set()
                await events_until(session)
                with anyio.fail_after(10):
                    await flushed.wait()


async def test_saturating_the_recorder_ends_the_turn_without_losing_accepted_events(
    tmp_path: Path,
) -> None:
    chunk = "x" * 16384  # each passes whole, one delivered delta apiece
    engine = ScriptedEngine(turns=[[*(MessageDelta(chunk) for _ in range(40)), Completed()]])
    config = RuntimeConfig(recorder_event_capacity=10)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("flood"))
            await anyio.sleep(0.3)  # the consumer is away; the recorder fills up
            seen = await events_until(session)
            assert engine.open_streams == 0 and engine.closed_streams == 1
        events = [e.event for e in seen]
        assert events[:2] == [TurnStarted(turn_id), ItemCompleted(turn_id, UserMessage("flood"))]  # type: ignore[arg-type]
        accepted = text_of(seen)
        # The turn's first three events and seven deltas filled the ten places.
        assert accepted == chunk * 7
        assert events[-3:] == [
            ItemCompleted(turn_id, AssistantMessage(accepted, interrupted=True)),  # type: ignore[arg-type]
            ErrorEvent("event recorder queue is full", turn_id),
            TurnAborted(turn_id, "failed"),  # type: ignore[arg-type]
        ]
        assert await journal(runtime, thread_id) == events


async def test_saturating_the_recorder_by_bytes(tmp_path: Path) -> None:
    chunk = "y" * 16000
    engine = ScriptedEngine(turns=[[*(MessageDelta(chunk) for _ in range(10)), Completed()]])
    config = RuntimeConfig(recorder_byte_budget=60_000)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("flood"))
            await anyio.sleep(0.3)
            seen = await events_until(session)
        events = [e.event for e in seen]
        assert text_of(seen) == chunk * 3
        assert events[-2] == ErrorEvent("event recorder queue is full", turn_id)
        assert await journal(runtime, thread_id) == events


async def test_items_and_usage_wait_for_a_slow_consumer_instead_of_being_refused(
    tmp_path: Path,
) -> None:
    calls = [ToolCallCompleted(f"c{i}", "tool", "{}") for i in range(40)]
    usage = [Usage(TokenUsage(1, 1, 2)) for _ in range(40)]
    engine = ScriptedEngine(turns=[[*calls, *usage, Completed()]])
    config = RuntimeConfig(recorder_event_capacity=8)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("many tools"))
            await anyio.sleep(0.3)  # the turn waits for the consumer: nothing is refused
            assert len(await journal(runtime, thread_id)) <= 8
            seen = await events_until(session)
        events = [e.event for e in seen]
        recorded_calls = [
            e.item.id
            for e in events
            if isinstance(e, ItemCompleted) and isinstance(e.item, ToolCallRecord)
        ]
        assert recorded_calls == [f"c{i}" for i in range(40)]
        results = [
            e.item.id
            for e in events
            if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord)
        ]
        assert results == recorded_calls  # every call gets its (error) result, in order
        # After the tool step the scripted engine answers by default.
        assert events[-1] == TurnComplete(turn_id, "You said: many tools")  # type: ignore[arg-type]
        first_step = sum(
            e.usage.total_tokens
            for e in events[
                : events.index(
                    next(
                        e
                        for e in events
                        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord)
                    )
                )
            ]
            if isinstance(e, UsageUpdated)
        )
        assert first_step == 80


async def test_a_session_that_stopped_delivery_runs_its_turns_with_no_consumer(
    tmp_path: Path,
) -> None:
    # roder serve's sessions: their events are read from the journal, nobody drains them.
    chunk = "z" * 100
    engine = ScriptedEngine(
        turns=[[*(MessageDelta(chunk) for _ in range(30)), Completed()] for _ in range(2)]
    )
    config = RuntimeConfig(recorder_event_capacity=8)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            session.stop_delivery()
            for text in ("one", "two"):
                turn_id = await session.submit(UserInput(text))
                with anyio.fail_after(10):
                    while not session.idle:  # noqa: ASYNC110 - no event to wait on here
                        await anyio.sleep(0.01)
                events = await journal(runtime, thread_id)
                assert events[-1] == TurnComplete(turn_id, chunk * 30)  # type: ignore[arg-type]
                await session.flush()  # nothing waits for a consumer
        assert not any(isinstance(e, ErrorEvent) for e in events)
        with pytest.raises(StoppedError):
            await session.next_event()  # closed: nothing was, nor is, delivered
