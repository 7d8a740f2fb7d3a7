"""In-turn native compaction: a boundary streamed by ``stream_turn`` is staged with its model
step and commits with it, atomically, only when the step ends with ``Completed``.

The seed endings (disconnect, failed, conflicting boundary, a tool call in a stream that
then ends without ``Completed``, preempted) and the rest (interrupted, someone else's
append) are played inside a turn; each is checked again after a cold restart — a new
``Runtime`` on the same store — and the next turn's request shows what replay sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import (
    AssistantContentDelta,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
    UsageUpdated,
)
from roder_api.inference import (
    Completed,
    Failed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.testing import Delay, Hang, Raise, ScriptedEngine, ScriptStep
from roder_api.tools import tool
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Interrupt, Runtime, RuntimeConfig, Steer, UserInput

pytestmark = pytest.mark.anyio

TERMINAL = (TurnComplete, TurnAborted)


def boundary(item_id: str = "cmp_inturn_1") -> ProviderMetadata:
    item = {"type": "compaction", "id": item_id, "encrypted_content": f"state-of-{item_id}"}
    return ProviderMetadata({"provider": "test", "output": [item], "compacted_input": [item]})


@tool
def lookup(q: str) -> str:
    """Look ``q`` up."""
    return f"found {q}"


def runtime_on(threads: Path, engine: ScriptedEngine) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.tool(lookup)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    config = RuntimeConfig()
    config.reliability.provider_retry_initial_backoff_ms = 0
    return Runtime(builder.build(), config)


async def events_until(session: Any, count: int = 1) -> list[JournalEvent]:
    seen: list[JournalEvent] = []
    with anyio.fail_after(20):
        while count:
            entry = await session.next_event()
            seen.append(entry)
            if isinstance(entry.event, TERMINAL):
                count -= 1
    return seen


async def seeded_thread(runtime: Runtime) -> str:
    """Return a thread with one finished turn (the history a compaction would trim)."""
    thread_id = (await runtime.create_thread()).thread_id
    assert await runtime.run_turn(thread_id, "first question") == "You said: first question"
    return thread_id


async def run_one(runtime: Runtime, thread_id: str, text: str) -> list[Event]:
    async with await runtime.start_session(thread_id) as session:
        await session.submit(UserInput(text))
        return [e.event for e in await events_until(session)]


def boundaries(items: Sequence[TranscriptItem]) -> list[TranscriptItem]:
    return [i for i in items if is_compaction_boundary(i)]


async def cold_check(threads: Path, thread_id: str, expect_boundary: bool) -> list[TranscriptItem]:
    """Open a new runtime on the same store; check the replay and what the next turn sends."""
    engine = ScriptedEngine()
    async with runtime_on(threads, engine) as runtime:
        replay = await runtime.replay_history(thread_id)
        assert bool(boundaries(replay)) is expect_boundary, replay
        if expect_boundary:
            assert is_compaction_boundary(replay[0])
        reply = await runtime.run_turn(thread_id, "after the restart")
        assert reply == "You said: after the restart"
        sent = list(engine.requests[-1][1].transcript)
    assert sent[: len(replay)] == replay
    assert sent[-1] == UserMessage("after the restart")
    return replay


async def test_a_completed_step_commits_its_boundary_before_its_reply(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [
        boundary(),
        boundary(),  # the same boundary repeated is fine
        Usage(TokenUsage(900, 40, 940)),
        MessageDelta("Picking up "),
        MessageDelta("from the summary."),
        ToolCallCompleted("call_lookup", "lookup", '{"q":"x"}'),
        Completed(),
    ]
    answer: list[ScriptStep] = [MessageDelta("Found x."), Completed()]
    engine = ScriptedEngine(
        turns=[[MessageDelta("You said: first question"), Completed()], script, answer]
    )
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        before = await runtime.get_thread(thread_id)
        events = await run_one(runtime, thread_id, "go on")
        assert isinstance(events[-1], TurnComplete)
        replay = await runtime.replay_history(thread_id)
        journal = await (await runtime.store()).read_events(thread_id, after=before.last_sequence)
    types = [type(e.event).__name__ for e in journal]
    assert types.count("CompactionStarted") == 1 and types.count("CompactionCommitted") == 1
    committed = types.index("CompactionCommitted")
    # One append: the boundary, the commit, then the step's call and reply; then the tool
    # step (its result) and the next model step follow, as in any turn.
    after = journal[committed - 1 :]
    reply = next(
        i
        for i, e in enumerate(after)
        if isinstance(e.event, ItemCompleted) and isinstance(e.event.item, AssistantMessage)
    )
    batch = [e.event for e in after[: reply + 1]]
    assert len({e.recorded_at_ms for e in after[: reply + 1]}) == 1  # one batch
    assert isinstance(batch[0], ItemCompleted) and is_compaction_boundary(batch[0].item)
    assert isinstance(batch[1], CompactionCommitted)
    assert [type(e.item).__name__ for e in batch[2:] if isinstance(e, ItemCompleted)] == [
        "ToolCallRecord",
        "AssistantMessage",
    ]
    assert isinstance(journal[-1].event, TurnComplete)
    # The user's message came before the boundary: replay starts at the boundary.
    assert replay[:3] == [
        boundary(),
        ToolCallRecord("call_lookup", "lookup", '{"q":"x"}'),
        AssistantMessage("Picking up from the summary."),
    ]
    assert isinstance(replay[3], ToolResultRecord) and replay[3].result == "found x"
    assert not replay[3].is_error and replay[4:] == [AssistantMessage("Found x.")]
    assert any(isinstance(e, UsageUpdated) and e.usage.total_tokens == 940 for e in events)
    again = await cold_check(threads, thread_id, expect_boundary=True)
    assert again[0] == boundary()


ENDINGS: dict[str, tuple[list[ScriptStep], str]] = {
    "disconnected": (
        [
            boundary(),
            Usage(TokenUsage(500, 3, 503)),
            MessageDelta("Part"),
            Raise(ProviderFailure(ProviderFailureKind.STREAM_INTERRUPTED, "cut")),
        ],
        "disconnected",
    ),
    "failed": (
        [boundary(), Usage(TokenUsage(500, 3, 503)), MessageDelta("Part"), Failed("gave up")],
        "failed",
    ),
    "tool call, then no Completed": (
        [
            boundary(),
            Usage(TokenUsage(500, 3, 503)),
            MessageDelta("Part"),
            ToolCallCompleted("call_x", "x", "{}"),
        ],
        "not_completed",
    ),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_a_step_that_does_not_complete_discards_its_boundary(
    tmp_path: Path, ending: str
) -> None:
    script, reason = ENDINGS[ending]
    threads = tmp_path / "threads"
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        history = await runtime.replay_history(thread_id)
        usage_before = (await runtime.get_thread(thread_id)).usage
        events = await run_one(runtime, thread_id, "go on")
        assert isinstance(events[-1], TurnAborted)
        assert CompactionDiscarded(reason, events[-1].turn_id) in events
        assert any(isinstance(e, CompactionStarted) for e in events)
        assert not any(isinstance(e, CompactionCommitted) for e in events)
        replay = await runtime.replay_history(thread_id)
        usage_after = (await runtime.get_thread(thread_id)).usage
    # History unchanged (no boundary), the input and the partial text kept, usage billed.
    assert replay == [*history, UserMessage("go on"), AssistantMessage("Part", True)]
    assert usage_after.total_tokens - usage_before.total_tokens == 503
    await cold_check(threads, thread_id, expect_boundary=False)


async def test_a_second_different_boundary_is_discarded_and_the_reply_kept(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [
        boundary("cmp_a"),
        boundary("cmp_b"),
        MessageDelta("Answer."),
        Completed(),
    ]
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        history = await runtime.replay_history(thread_id)
        events = await run_one(runtime, thread_id, "go on")
        assert isinstance(events[-1], TurnComplete)
        assert CompactionDiscarded("conflicting_boundary", events[-1].turn_id) in events
        replay = await runtime.replay_history(thread_id)
    assert replay == [*history, UserMessage("go on"), AssistantMessage("Answer.")]
    await cold_check(threads, thread_id, expect_boundary=False)


async def test_a_steer_preempts_a_step_holding_a_boundary(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [
        Usage(TokenUsage(700, 2, 702)),
        boundary(),
        MessageDelta("Par"),
        Hang(),
    ]
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        history = await runtime.replay_history(thread_id)
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("go on"))
            seen: list[Event] = []
            with anyio.fail_after(20):
                while not seen or not isinstance(seen[-1], AssistantContentDelta):
                    seen.append((await session.next_event()).event)
            assert await session.submit(Steer("actually, stop")) == turn_id
            seen += [e.event for e in await events_until(session)]
        assert CompactionDiscarded("preempted", turn_id) in seen
        assert seen[-1] == TurnComplete(turn_id, "You said: actually, stop")
        assert engine.open_streams == 0
        replay = await runtime.replay_history(thread_id)
    # The next model step got the uncompacted history, the partial text and the steer.
    assert list(engine.requests[-1][1].transcript) == [
        *history,
        UserMessage("go on"),
        AssistantMessage("Par", True),
        UserMessage("actually, stop"),
    ]
    assert not boundaries(replay)
    await cold_check(threads, thread_id, expect_boundary=False)


async def test_an_interrupt_discards_the_staged_boundary(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [boundary(), MessageDelta("Par"), Hang()]
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        history = await runtime.replay_history(thread_id)
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("go on"))
            with anyio.fail_after(20):
                while not isinstance((await session.next_event()).event, AssistantContentDelta):
                    pass
            await session.submit(Interrupt(turn_id))
            seen = [e.event for e in await events_until(session)]
        assert CompactionDiscarded("interrupted", turn_id) in seen
        assert isinstance(seen[-1], TurnAborted) and seen[-1].reason == "interrupted"
        replay = await runtime.replay_history(thread_id)
    assert replay == [*history, UserMessage("go on"), AssistantMessage("Par", True)]
    await cold_check(threads, thread_id, expect_boundary=False)


async def test_an_append_by_someone_else_meanwhile_discards_the_boundary(tmp_path: Path) -> None:
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [boundary(), Delay(0.5), MessageDelta("Answer."), Completed()]
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("go on"))
            with anyio.fail_after(20):
                while not isinstance((await session.next_event()).event, CompactionStarted):
                    pass
            # A script appends while the step holds its boundary (appends need no lease).
            await runtime.append_events(
                thread_id, [ItemCompleted("turn_script", UserMessage("from a script"))]
            )
            seen = [e.event for e in await events_until(session)]
        assert CompactionDiscarded("conflict", turn_id) in seen
        assert seen[-1] == TurnComplete(turn_id, "Answer.")
        replay = await runtime.replay_history(thread_id)
    assert not boundaries(replay)
    assert UserMessage("from a script") in replay and replay[-1] == AssistantMessage("Answer.")
    await cold_check(threads, thread_id, expect_boundary=False)


async def test_input_queued_for_the_next_turn_does_not_discard_the_boundary(
    tmp_path: Path,
) -> None:
    """Accepted input of a later turn is no transcript item: the boundary still commits."""
    threads = tmp_path / "threads"
    script: list[ScriptStep] = [boundary(), Delay(0.3), MessageDelta("Answer."), Completed()]
    engine = ScriptedEngine(turns=[[MessageDelta("You said: first question"), Completed()], script])
    async with runtime_on(threads, engine) as runtime:
        thread_id = await seeded_thread(runtime)
        async with await runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("go on"))
            with anyio.fail_after(20):
                while not isinstance((await session.next_event()).event, CompactionStarted):
                    pass
            await session.submit(UserInput("and the next thing"))  # queued behind the turn
            seen = [e.event for e in await events_until(session, count=2)]
        assert CompactionCommitted(turn_id) in seen
        replay = await runtime.replay_history(thread_id)
    assert replay[:2] == [boundary(), AssistantMessage("Answer.")]
    assert replay[2] == UserMessage("and the next thing")
    await cold_check(threads, thread_id, expect_boundary=True)
