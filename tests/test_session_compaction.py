"""Sessions and automatic compaction: a Steer preempts it, an Interrupt stops it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api.events import (
    CompactionDiscarded,
    CompactionStarted,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.inference import AgentInferenceRequest, InferenceTurnContext, TokenUsage, Usage
from roder_api.testing import Hang, Script, ScriptedEngine, ScriptStep
from roder_api.transcript import AssistantMessage, TranscriptItem, UserMessage
from roder_runtime import CompactionConfig, Interrupt, RuntimeConfig, Steer, UserInput

from .conftest import make_runtime
from .session_support import events_until, journal

pytestmark = pytest.mark.anyio


def big_history() -> list[TranscriptItem]:
    text = "w" * 2000
    return [UserMessage(text), AssistantMessage(text)]


class BlockedCompaction:
    """A compaction script that reports when the engine starts it, then blocks."""

    def __init__(self, *steps: ScriptStep) -> None:
        self.steps = steps
        self.started = anyio.Event()

    def __call__(self, ctx: InferenceTurnContext, request: AgentInferenceRequest, n: int) -> Script:
        self.started.set()
        return [*self.steps, Hang()]

    async def running(self) -> None:
        with anyio.fail_after(20):
            await self.started.wait()


async def test_steer_preempts_a_running_compaction_and_joins_the_turn(tmp_path: Path) -> None:
    compaction = BlockedCompaction(Usage(TokenUsage(7, 0, 7)))
    engine = ScriptedEngine(compactions=compaction, context_window=2000)
    config = RuntimeConfig(compaction=CompactionConfig(auto_compact_fraction=0.5))
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.append_events(thread_id, [ItemCompleted("t0", i) for i in big_history()])
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("next"))
            seen = await events_until(session, CompactionStarted)
            await compaction.running()
            assert await session.submit(Steer("never mind, go on")) == turn_id
            seen += await events_until(session)
        events = [e.event for e in seen]
        assert events[0] == TurnStarted(turn_id)  # type: ignore[arg-type]
        assert CompactionDiscarded("preempted", turn_id) in events
        assert isinstance(events[-1], TurnComplete)
        assert events[-1].last_assistant_message == "You said: never mind, go on"
        # The history was not compacted: the model saw all of it, the input, then the steer.
        transcript = list(engine.requests[-1][1].transcript)
        assert transcript[:3] == [*big_history(), UserMessage("next")]
        assert transcript[-1] == UserMessage("never mind, go on")
        assert engine.open_streams == 0
        assert (await runtime.get_thread(thread_id)).usage.total_tokens >= 7


async def test_interrupt_stops_a_running_compaction(tmp_path: Path) -> None:
    compaction = BlockedCompaction()
    engine = ScriptedEngine(compactions=compaction, context_window=2000)
    config = RuntimeConfig(compaction=CompactionConfig(auto_compact_fraction=0.5))
    async with make_runtime(tmp_path, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.append_events(thread_id, [ItemCompleted("t0", i) for i in big_history()])
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("next"))
            assert turn_id is not None
            await events_until(session, CompactionStarted)
            await compaction.running()
            await session.submit(Interrupt(turn_id))
            with anyio.fail_after(20):
                await events_until(session)
        events = await journal(runtime, thread_id)
        assert events[-1] == TurnAborted(turn_id, "interrupted")
        # The input is journaled, the history is unchanged, nothing was sent to the model.
        assert ItemCompleted(turn_id, UserMessage("next")) in events
        assert await runtime.replay_history(thread_id) == [*big_history(), UserMessage("next")]
        assert engine.requests == [] and engine.open_streams == 0
