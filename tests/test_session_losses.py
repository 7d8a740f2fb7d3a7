"""Nothing accepted is lost: a cancelled caller, a steer at the turn's end, a failing turn,
a store that stops answering, a closing runtime — and retries are visible.

``submit`` below also drives the synchronous ``Session.submit`` of round 1, so that these
tests show each loss on that code too.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import RecorderError, StoppedError
from roder_api.events import (
    AssistantContentDelta,
    Event,
    InputAccepted,
    ItemCompleted,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    WarningEvent,
)
from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import (
    Delay,
    Hang,
    MemoryThreadStore,
    MemoryThreadStoreFactory,
    Raise,
    ScriptedEngine,
)
from roder_api.transcript import UserMessage
from roder_runtime import Op, Runtime, RuntimeConfig, Session, Steer, UserInput

from .conftest import make_runtime
from .session_support import events_until, journal

pytestmark = pytest.mark.anyio


async def submit(session: Session, op: Op) -> str | None:
    """Submit ``op``, awaiting ``submit`` when it is a coroutine (it is since round 2)."""
    result: object = session.submit(op)
    if inspect.isawaitable(result):
        result = await result
    assert result is None or isinstance(result, str)
    return result


def user_texts(events: list[Event]) -> list[str]:
    return [
        e.item.text
        for e in events
        if isinstance(e, ItemCompleted) and isinstance(e.item, UserMessage)
    ]


def every_started_turn_ended(events: list[Event]) -> bool:
    started = [e.turn_id for e in events if isinstance(e, TurnStarted)]
    ended = {e.turn_id for e in events if isinstance(e, (TurnComplete, TurnAborted))}
    return all(turn_id in ended for turn_id in started)


async def test_a_caller_that_cancels_its_own_task_loses_no_accepted_input(tmp_path: Path) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("working on it"), Hang()]])
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        with anyio.fail_after(20), anyio.CancelScope() as caller:
            async with runtime.start_session(thread_id) as session:
                await submit(session, UserInput("first"))
                await events_until(session, AssistantContentDelta)
                await submit(session, UserInput("second"))
                caller.cancel()  # the caller's own task is cancelled, mid-turn
                await anyio.sleep(30)
        assert caller.cancelled_caught
        events = await journal(runtime, thread_id)
        assert user_texts(events) == ["first", "second"]
        assert every_started_turn_ended(events)
        assert engine.open_streams == 0
        # The next turn answers with all of it in its history.
        async with runtime.start_session(thread_id) as session:
            third = await submit(session, UserInput("third"))
            with anyio.fail_after(20):
                while True:
                    event = (await session.next_event()).event
                    if isinstance(event, TurnComplete) and event.turn_id == third:
                        break
        transcript = list(engine.requests[-1][1].transcript)
        assert [i.text for i in transcript if isinstance(i, UserMessage)] == [
            "first",
            "second",
            "third",
        ]


async def test_a_steer_that_arrives_as_the_turn_ends_is_answered(tmp_path: Path) -> None:
    # Four places: the turn's first four events fill the recorder, so its last events wait
    # for the consumer — the turn has decided to end when the steer arrives.
    engine = ScriptedEngine(
        turns=[[MessageDelta("answer"), Completed()], [MessageDelta("steered"), Completed()]]
    )
    config = RuntimeConfig(recorder_event_capacity=4)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            first = await submit(session, UserInput("question"))
            await anyio.sleep(0.3)  # the consumer is away
            await submit(session, Steer("one more thing"))
            with anyio.fail_after(10):
                seen = [e.event for e in await events_until(session, TurnComplete, count=2)]
        completed = [e for e in seen if isinstance(e, TurnComplete)]
        assert completed[0] == TurnComplete(first, "answer")  # type: ignore[arg-type]
        assert completed[1].last_assistant_message == "steered"
        transcript = list(engine.requests[-1][1].transcript)
        assert transcript[-1] == UserMessage("one more thing")
        assert every_started_turn_ended(await journal(runtime, thread_id))


async def test_a_steer_given_to_a_failing_turn_is_kept_for_the_next_turn(tmp_path: Path) -> None:
    refused = ProviderFailure(ProviderFailureKind.INVALID_REQUEST, "refused")
    engine = ScriptedEngine(turns=[[MessageDelta("half"), Delay(0.5), Raise(refused)]])
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            first = await submit(session, UserInput("question"))
            await events_until(session, AssistantContentDelta)
            assert await submit(session, Steer("and also this")) == first
            failed = [e.event for e in await events_until(session)]
            assert failed[-1] == TurnAborted(first, "failed")  # type: ignore[arg-type]
            await submit(session, UserInput("next"))
            await events_until(session)
        events = await journal(runtime, thread_id)
        assert ItemCompleted(first, UserMessage("and also this")) in events  # type: ignore[arg-type]
        transcript = list(engine.requests[-1][1].transcript)
        assert [i.text for i in transcript if isinstance(i, UserMessage)] == [
            "question",
            "and also this",
            "next",
        ]


def stalling_factory() -> tuple[MemoryThreadStoreFactory, anyio.Event]:
    """Return a memory store factory whose appends block once the event is set."""
    stall = anyio.Event()

    class Stalling(MemoryThreadStore):
        async def fault_point(self, operation: str, thread_id: str | None) -> None:
            if stall.is_set() and operation == "append_events":
                await anyio.sleep_forever()

    return MemoryThreadStoreFactory(store_class=Stalling), stall


async def test_a_store_that_stops_answering_fails_the_turn_naming_the_store() -> None:
    engine = ScriptedEngine(
        turns=[[MessageDelta("a"), Delay(0.2), MessageDelta("b"), Delay(0.2), Completed()]]
    )
    factory, stall = stalling_factory()
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(factory)
    async with Runtime(builder.build(), RuntimeConfig(turn_timeout_s=0.5)) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        with anyio.fail_after(15):
            async with runtime.start_session(thread_id) as session:
                await submit(session, UserInput("hi"))
                await events_until(session, AssistantContentDelta)
                stall.set()
                with pytest.raises(RecorderError) as stopped:
                    while True:
                        await session.next_event()
                assert "thread store 'memory' did not answer within 0.5 s" in str(stopped.value)
                with pytest.raises(StoppedError):
                    await submit(session, UserInput("more"))
            # ... and the session closed cleanly, within the deadline.
        assert engine.open_streams == 0


async def test_closing_the_runtime_closes_its_open_sessions(tmp_path: Path) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("long"), Hang()]])
    runtime = make_runtime(tmp_path, engine)
    with anyio.fail_after(20):  # entered before the session: it is closed inside
        thread_id = (await runtime.create_thread()).thread_id
        session = await runtime.start_session(thread_id)
        turn_id = await submit(session, UserInput("hi"))
        await events_until(session, AssistantContentDelta)
        await runtime.aclose()
    assert engine.open_streams == 0
    with pytest.raises(StoppedError):
        await submit(session, UserInput("after"))
    async with make_runtime(tmp_path, engine) as again:
        events = await journal(again, thread_id)
        assert events[-1] == TurnAborted(turn_id, "runtime_closed")  # type: ignore[arg-type]


async def test_input_a_killed_session_accepted_is_answered_by_the_next_session(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine()
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        # What a session killed mid-turn leaves: a steer and a queued input, accepted.
        await runtime.append_events(
            thread_id,
            [
                TurnStarted("turn_dead"),
                ItemCompleted("turn_dead", UserMessage("cut off")),
                ModelStepStarted("turn_dead", "step_1"),
                InputAccepted("turn_dead", "steered", steer=True),
                InputAccepted("turn_queued", "queued"),
            ],
        )
        async with runtime.start_session(thread_id) as session:
            with anyio.fail_after(20):
                seen = [e.event for e in await events_until(session, count=2)]
        assert seen[:2] == [
            ItemCompleted("turn_dead", UserMessage("steered")),
            TurnAborted("turn_dead", "process_exited"),
        ]
        assert seen[-1] == TurnComplete("turn_queued", "You said: queued")  # type: ignore[arg-type]
        transcript = list(engine.requests[-1][1].transcript)
        assert transcript[-3:] == [
            UserMessage("cut off"),
            UserMessage("steered"),
            UserMessage("queued"),
        ]


async def test_each_retry_journals_a_warning_saying_attempt_and_delay(tmp_path: Path) -> None:
    overloaded = ProviderFailure(ProviderFailureKind.OVERLOADED, "busy right now")
    engine = ScriptedEngine(
        turns=[
            [Usage(TokenUsage(5, 0, 5)), Raise(overloaded)],
            [Raise(overloaded)],
            [MessageDelta("ok"), Completed()],
        ]
    )
    config = RuntimeConfig()
    config.reliability.provider_retry_max_attempts = 3
    config.reliability.provider_retry_initial_backoff_ms = 1
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "hi") == "ok"
        warnings = [e for e in await journal(runtime, thread_id) if isinstance(e, WarningEvent)]
        assert [w.message.split(" failed")[0] for w in warnings] == [
            "model call attempt 1 of 3",
            "model call attempt 2 of 3",
        ]
        assert "busy right now" in warnings[0].message
        assert "retrying in " in warnings[0].message and warnings[0].turn_id is not None
