"""Sessions on a real JSONL store: bounded submissions, turns, interrupts, retries, steering."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import (
    BusyError,
    InputTooLargeError,
    RecorderError,
    StoppedError,
    StoreError,
    ThreadNotFoundError,
)
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.testing import Delay, Hang, Raise, ScriptedEngine, ScriptStep
from roder_api.transcript import (
    AssistantMessage,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_runtime import Interrupt, Runtime, RuntimeConfig, Steer, UserInput

from .conftest import make_runtime
from .session_support import TERMINAL, events_until, journal, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_turn_streams_persisted_events_in_order(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        turns=[
            [
                ReasoningDelta("thinking"),
                MessageDelta("Hello"),
                MessageDelta(" there"),
                ToolCallCompleted("call_1", "lookup", '{"q": 1}'),
                Usage(TokenUsage(10, 3, 13)),
                Completed(),
            ]
        ]
    )
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("hi"))
            seen: list[JournalEvent] = []
            with anyio.fail_after(20):
                while not seen or not isinstance(seen[-1].event, TERMINAL):
                    entry = await session.next_event()
                    # Delivered means persisted: the event is already in the journal.
                    page = await runtime.event_page(thread_id, before=None, limit=1000)
                    assert entry in page.events
                    seen.append(entry)
            second = await session.submit(UserInput("again"))
            seen_second = await events_until(session)
        events = [e.event for e in seen]
        assert events[0] == TurnStarted(turn_id)  # type: ignore[arg-type]
        assert events[1] == ItemCompleted(turn_id, UserMessage("hi"))  # type: ignore[arg-type]
        assert isinstance(events[2], ModelStepStarted)
        # The call of a tool nobody offered gets an error result; the model goes on.
        assert text_of(seen) == "Hello thereYou said: hi"
        assert text_of(seen, ContentPhase.REASONING) == "thinking"
        items = [e.item for e in events if isinstance(e, ItemCompleted)]
        unknown = "unknown tool 'lookup'; the tools offered: none"
        assert items == [
            UserMessage("hi"),
            ToolCallRecord("call_1", "lookup", '{"q": 1}'),
            Reasoning("thinking"),
            AssistantMessage("Hello there"),
            ToolResultRecord("call_1", "lookup", unknown, is_error=True),
            AssistantMessage("You said: hi"),
        ]
        assert (
            UsageUpdated(turn_id, TokenUsage(10, 3, 13), "turn", "scripted-default", "scripted")
            in events
        )
        assert events[-1] == TurnComplete(turn_id, "You said: hi")  # type: ignore[arg-type]
        assert [e.sequence for e in seen + seen_second] == list(
            range(1, len(seen) + len(seen_second) + 1)
        )
        assert seen_second[-1].event == TurnComplete(second, "You said: again")  # type: ignore[arg-type]
        # The second turn saw the replay history plus its input.
        assert list(engine.requests[2][1].transcript) == [*items, UserMessage("again")]
        assert engine.open_streams == 0 and engine.closed_streams == 3
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and [t.turn_id for t in snapshot.turns] == [turn_id, second]


async def test_oversized_input_is_refused_before_it_is_queued(tmp_path: Path) -> None:
    config = RuntimeConfig(max_input_bytes=10)
    async with make_runtime(tmp_path, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            with pytest.raises(InputTooLargeError) as refused:
                await session.submit(UserInput("é" * 6))  # 6 characters, 12 bytes
            assert refused.value.size == 12 and refused.value.limit == 10
            with pytest.raises(InputTooLargeError):
                await session.submit(Steer("x" * 11))
            await session.submit(UserInput("é" * 5))  # exactly 10 bytes is fine
            await events_until(session)
        events = await journal(runtime, thread_id)
        users = [e.item for e in events if isinstance(e, ItemCompleted)]
        assert users[0] == UserMessage("é" * 5)
        assert sum(isinstance(e, TurnStarted) for e in events) == 1


async def test_a_full_submission_queue_answers_busy_and_drops_nothing(tmp_path: Path) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("slow"), Hang()]])
    config = RuntimeConfig(submission_queue_capacity=3)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            first = await session.submit(UserInput("one"))
            assert first is not None
            await events_until(session, AssistantContentDelta)  # "one" runs, the queue is free
            accepted = [await session.submit(UserInput(f"queued {i}")) for i in range(3)]
            with pytest.raises(BusyError):
                await session.submit(UserInput("refused"))
            with pytest.raises(BusyError):
                await session.submit(UserInput("still refused"))
            await session.submit(Interrupt(first))  # acts at once, needs no place in the queue
            await events_until(session, TERMINAL, count=4)
        events = await journal(runtime, thread_id)
        texts = [e.item.text for e in events if isinstance(e, ItemCompleted)]  # type: ignore[union-attr]
        assert "refused" not in texts and "still refused" not in texts
        for text in ["one", "queued 0", "queued 1", "queued 2"]:
            assert text in texts
        ended = [e.turn_id for e in events if isinstance(e, TERMINAL)]
        assert ended == [first, *accepted]


async def test_interrupt_delivers_accepted_text_then_aborts_and_closes_the_stream(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine(
        turns=[[MessageDelta("Hello"), MessageDelta(", wor"), Hang(), MessageDelta("late")]]
    )
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("hi"))
            assert turn_id is not None
            seen: list[JournalEvent] = []
            with anyio.fail_after(20):
                while text_of(seen) != "Hello, wor":
                    seen.append(await session.next_event())
            assert engine.open_streams == 1
            await session.submit(Interrupt(turn_id))
            seen += await events_until(session)
            assert engine.open_streams == 0 and engine.closed_streams == 1
            await anyio.sleep(0.1)
        assert text_of(seen) == "Hello, wor"
        tail = [e.event for e in seen[-2:]]
        assert tail == [
            ItemCompleted(turn_id, AssistantMessage("Hello, wor", interrupted=True)),
            TurnAborted(turn_id, "interrupted"),
        ]
        events = await journal(runtime, thread_id)
        assert events == [e.event for e in seen]
        assert events[-1] == TurnAborted(turn_id, "interrupted")
        # The interrupted text is history: the next turn replays it.
        assert await runtime.replay_history(thread_id) == [
            UserMessage("hi"),
            AssistantMessage("Hello, wor", interrupted=True),
        ]


async def test_a_stream_that_would_yield_after_the_abort_adds_nothing(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        turns=[[MessageDelta("partial"), Delay(0.3), MessageDelta(" late"), Completed()]]
    )
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("hi"))
            assert turn_id is not None
            await events_until(session, AssistantContentDelta)
            await session.submit(Interrupt(turn_id))
            await events_until(session)
            await anyio.sleep(0.5)  # past the moment the stream would have yielded again
            assert engine.open_streams == 0
        events = await journal(runtime, thread_id)
        assert events[-1] == TurnAborted(turn_id, "interrupted")
        assert "late" not in str(events)


async def test_closing_mid_turn_closes_the_stream_and_keeps_the_partial_text(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("half an"), Hang()]])
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        session = await runtime.start_session(thread_id)
        turn_id = await session.submit(UserInput("hi"))
        queued = await session.submit(UserInput("never started"))
        await events_until(session, AssistantContentDelta)
        # (close in the task that started the session, outside later cancel scopes)
        await session.aclose()
        assert engine.open_streams == 0 and engine.closed_streams == 1
        with pytest.raises(StoppedError):
            await session.submit(UserInput("too late"))
        events = await journal(runtime, thread_id)
        assert ItemCompleted(turn_id, AssistantMessage("half an", interrupted=True)) in events  # type: ignore[arg-type]
        assert TurnAborted(turn_id, "closed") in events  # type: ignore[arg-type]
        # The queued input is not dropped: it is journaled as a turn closed before it ran.
        assert events[-3:] == [
            TurnStarted(queued),  # type: ignore[arg-type]
            ItemCompleted(queued, UserMessage("never started")),  # type: ignore[arg-type]
            TurnAborted(queued, "closed"),  # type: ignore[arg-type]
        ]
        # The thread is free for a new session, which finds nothing left running.
        async with await runtime.start_session(thread_id) as again:
            await again.submit(UserInput("back"))
            entries = await events_until(again)
            assert isinstance(entries[0].event, TurnStarted)


async def test_interrupting_a_queued_turn_journals_it_without_calling_the_model(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("busy"), Hang()]])
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            running = await session.submit(UserInput("first"))
            queued = await session.submit(UserInput("second"))
            assert running is not None and queued is not None
            await session.submit(Interrupt("turn_unknown"))  # nothing to do
            await session.submit(Interrupt(queued))
            await events_until(session, AssistantContentDelta)
            await session.submit(Interrupt(running))
            entries = await events_until(session, TERMINAL, count=2)
        assert [e.event for e in entries][-3:] == [
            TurnStarted(queued),
            ItemCompleted(queued, UserMessage("second")),
            TurnAborted(queued, "interrupted"),
        ]
        assert len(engine.requests) == 1


async def test_retry_before_output_and_error_after_output_bill_every_attempt(
    tmp_path: Path,
) -> None:
    overloaded = ProviderFailure(ProviderFailureKind.OVERLOADED, "busy")
    engine = ScriptedEngine(
        turns=[
            [Usage(TokenUsage(5, 0, 5)), Raise(overloaded)],
            [MessageDelta("ok"), Usage(TokenUsage(5, 1, 6)), Completed()],
            [MessageDelta("half"), Usage(TokenUsage(7, 1, 8)), Raise(overloaded)],
        ]
    )
    config = RuntimeConfig()
    config.reliability.provider_retry_initial_backoff_ms = 0
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            first = await session.submit(UserInput("one"))
            retried = await events_until(session)
            second = await session.submit(UserInput("two"))
            failed = await events_until(session)
        assert retried[-1].event == TurnComplete(first, "ok")  # type: ignore[arg-type]
        assert sum(isinstance(e.event, ModelStepStarted) for e in retried) == 2
        assert text_of(failed) == "half"  # delivered once, never repeated by a retry
        assert sum(isinstance(e.event, ModelStepStarted) for e in failed) == 1
        tail = [e.event for e in failed[-3:]]
        assert tail[0] == ItemCompleted(second, AssistantMessage("half", interrupted=True))  # type: ignore[arg-type]
        assert isinstance(tail[1], ErrorEvent) and "busy" in tail[1].message
        assert tail[2] == TurnAborted(second, "failed")  # type: ignore[arg-type]
        assert len(engine.requests) == 3
        assert (await runtime.get_thread(thread_id)).usage.total_tokens == 5 + 6 + 8


class FailingStore(JsonlThreadStore):
    """A real JSONL store whose appends fail once one with streamed text was persisted
    (mid-turn, however the recorder batched the turn's start)."""

    def __init__(self, base_path: Path) -> None:
        super().__init__(base_path)
        self.streamed = False

    async def append_events(self, thread_id: str, events: Sequence[Event]) -> list[JournalEvent]:
        if self.streamed:
            raise StoreError("the disk went away")
        entries = await super().append_events(thread_id, events)
        self.streamed = any(isinstance(e, AssistantContentDelta) for e in events)
        return entries


class FailingFactory(JsonlThreadStoreFactory):
    async def open(self) -> JsonlThreadStore:
        await super().open()
        return FailingStore(self.base_path)


async def test_a_store_failing_mid_turn_stops_delivery_and_flush_raises(tmp_path: Path) -> None:
    engine = ScriptedEngine(turns=[[MessageDelta("a"), Delay(0.1), MessageDelta("b"), Hang()]])
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(FailingFactory(tmp_path / "threads"))
    async with Runtime(builder.build()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            await session.submit(UserInput("hi"))
            delivered: list[JournalEvent] = []
            with anyio.fail_after(20), pytest.raises(RecorderError) as stopped:
                while True:
                    delivered.append(await session.next_event())
            assert isinstance(stopped.value.__cause__, StoreError)
            with pytest.raises(RecorderError) as flush_error:
                await session.flush()
            assert "the disk went away" in str(flush_error.value)
            with pytest.raises(StoppedError):
                await session.submit(UserInput("more"))
        assert engine.open_streams == 0  # the turn stopped; closing waited for it
        persisted = await runtime.store()
        assert isinstance(persisted, FailingStore)
        on_disk = await JsonlThreadStore(tmp_path / "threads").read_events(thread_id)
        assert delivered == on_disk[: len(delivered)]
        assert delivered and not any(isinstance(e.event, TERMINAL) for e in on_disk)


async def test_steer_adds_input_to_the_running_turn(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        turns=[[MessageDelta("thinking about it"), Delay(0.3), Completed()]], repeat_last=False
    )
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("question"))
            seen = await events_until(session, AssistantContentDelta)
            assert await session.submit(Steer("also this")) == turn_id
            seen += await events_until(session)
            # With no turn running a steer starts one.
            other = await session.submit(Steer("new topic"))
            assert other != turn_id
            after = await events_until(session)
        events = [e.event for e in seen]
        assert sum(isinstance(e, ModelStepStarted) for e in events) == 2
        assert ItemCompleted(turn_id, UserMessage("also this")) in events  # type: ignore[arg-type]
        assert events[-1] == TurnComplete(turn_id, "You said: also this")  # type: ignore[arg-type]
        assert list(engine.requests[1][1].transcript) == [
            UserMessage("question"),
            AssistantMessage("thinking about it"),
            UserMessage("also this"),
        ]
        assert after[-1].event == TurnComplete(other, "You said: new topic")  # type: ignore[arg-type]


async def test_steer_preempts_a_running_compaction(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            with session.compaction_preempt() as preempt:
                assert not preempt.is_set()
                await session.submit(Steer("stop compacting"))
                assert preempt.is_set()
            await events_until(session)


async def test_start_session_checks_the_thread_and_allows_one_session(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        with pytest.raises(ThreadNotFoundError):
            await runtime.start_session("missing")
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id):
            with pytest.raises(BusyError):
                await runtime.start_session(thread_id)
        async with await runtime.start_session(thread_id, engine="scripted", model="m") as s:
            assert s.model == "m" and s.engine.id == "scripted"
        # Without the await, start_session is an async context manager of its own.
        async with runtime.start_session(thread_id) as session:
            await session.submit(UserInput("hi"))
            assert isinstance((await session.next_event()).event, TurnStarted)
        with pytest.raises(StoppedError):
            await session.submit(UserInput("closed"))


async def test_a_turn_left_running_is_closed_on_open_and_the_thread_continues(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine()
    async with make_runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        # What a process that died mid-turn leaves behind.
        await runtime.append_events(
            thread_id,
            [
                TurnStarted("turn_dead"),
                ItemCompleted("turn_dead", UserMessage("cut off")),
                ModelStepStarted("turn_dead", "step_1"),
                AssistantContentDelta("turn_dead", "step_1", ContentPhase.FINAL_ANSWER, "par"),
            ],
        )
    async with make_runtime(tmp_path, engine) as runtime:
        async with await runtime.start_session(thread_id) as session:
            first = await session.next_event()
            # The text the user saw is kept, as an interrupt keeps it (issue 21, item 11).
            assert first.event == ItemCompleted("turn_dead", AssistantMessage("par", True))
            assert first.sequence == 5
            second = await session.next_event()
            assert second.event == TurnAborted("turn_dead", "process_exited")
            await session.submit(UserInput("still there?"))
            await events_until(session)
        async with await runtime.start_session(thread_id) as session:
            await session.submit(UserInput("and now"))
            assert isinstance((await session.next_event()).event, TurnStarted)
        events = (await runtime.event_page(thread_id, limit=1000)).events
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        assert list(engine.requests[0][1].transcript) == [
            UserMessage("cut off"),
            AssistantMessage("par", interrupted=True),
            UserMessage("still there?"),
        ]


async def test_a_reply_larger_than_the_byte_budget_still_completes(tmp_path: Path) -> None:
    chunk = "z" * 15_000
    script: list[ScriptStep] = [MessageDelta(chunk), Delay(0.05)] * 4
    engine = ScriptedEngine(turns=[[*script, Completed()]])
    config = RuntimeConfig(recorder_byte_budget=40_000)
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("long answer please"))
            seen = await events_until(session)
        assert text_of(seen) == chunk * 4
        assert ItemCompleted(turn_id, AssistantMessage(chunk * 4)) in [e.event for e in seen]  # type: ignore[arg-type]
        assert seen[-1].event == TurnComplete(turn_id, chunk * 4)  # type: ignore[arg-type]


class FlakyReadStore(JsonlThreadStore):
    """A real JSONL store whose first replay read fails."""

    def __init__(self, base_path: Path) -> None:
        super().__init__(base_path)
        self.replays = 0

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        self.replays += 1
        if self.replays == 1:
            raise StoreError("the replay index is unreadable")
        return await super().replay_events(thread_id)


class FlakyReadFactory(JsonlThreadStoreFactory):
    async def open(self) -> JsonlThreadStore:
        await super().open()
        return FlakyReadStore(self.base_path)


async def test_a_failed_history_read_fails_the_turn_but_keeps_the_input(tmp_path: Path) -> None:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(FlakyReadFactory(tmp_path / "threads"))
    async with Runtime(builder.build()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            first = await session.submit(UserInput("lost?"))
            failed = [e.event for e in await events_until(session)]
            second = await session.submit(UserInput("again"))
            worked = await events_until(session)
        assert failed[:2] == [TurnStarted(first), ItemCompleted(first, UserMessage("lost?"))]  # type: ignore[arg-type]
        assert isinstance(failed[2], ErrorEvent) and "unreadable" in failed[2].message
        assert failed[3] == TurnAborted(first, "failed")  # type: ignore[arg-type]
        assert worked[-1].event == TurnComplete(second, "You said: again")  # type: ignore[arg-type]
