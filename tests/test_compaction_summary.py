"""Summarising compaction for engines without native compaction, and its prompt."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from roder_api.errors import CompactionFailed
from roder_api.events import CompactionCommitted, CompactionStarted
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.testing import Raise, Script, ScriptedEngine
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)
from roder_runtime import ReliabilityConfig, RuntimeConfig
from roder_runtime.compaction._estimates import estimate_transcript_tokens
from roder_runtime.compaction._summary import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_REQUEST,
    summary_boundary,
    summary_prompt,
)

from .conftest import make_runtime

USAGE = Usage(TokenUsage(50, 20, 70))

HISTORY: list[TranscriptItem] = [
    UserMessage("goal: write a CSV importer"),
    AssistantMessage("reading the file first"),
    ToolCallRecord("c1", "read", '{"path": "a.csv"}'),
    ToolCallRecord("c2", "read", '{"path": "b.csv"}'),
    ToolResultRecord("c1", "read", "x" * 400),
    ToolResultRecord("c2", "read", "y" * 400),
    AssistantMessage("both files read " + "z" * 300),
    ToolCallRecord("c3", "shell", "{}"),  # interrupted: it never got a result
    UserMessage("latest: also handle quotes"),
    ToolResultRecord("c4", "shell", "a result without its call"),
]


def pairs_intact(items: Sequence[TranscriptItem]) -> bool:
    calls = [i.id for i in items if isinstance(i, ToolCallRecord)]
    results = [i.id for i in items if isinstance(i, ToolResultRecord)]
    return sorted(calls) == sorted(results)


def test_the_prompt_keeps_pairs_and_drops_orphans() -> None:
    prompt = summary_prompt(HISTORY)
    assert prompt[-1] == UserMessage(SUMMARY_REQUEST)
    assert prompt[:-1] == [
        item
        for item in HISTORY
        if not (isinstance(item, (ToolCallRecord, ToolResultRecord)) and item.id in ("c3", "c4"))
    ]
    assert pairs_intact(prompt)


@pytest.mark.parametrize("budget", [1, 40, 80, 150, 250, 400, 10_000])
def test_a_trimmed_prompt_keeps_goal_latest_and_whole_pairs(budget: int) -> None:
    prompt = summary_prompt(HISTORY, budget_tokens=budget)
    assert prompt[0] == UserMessage("goal: write a CSV importer")
    assert UserMessage("latest: also handle quotes") in prompt
    assert prompt[-1] == UserMessage(SUMMARY_REQUEST)
    assert pairs_intact(prompt)
    kept = [i for i in HISTORY if i in prompt]
    assert kept == [i for i in prompt if i != UserMessage(SUMMARY_REQUEST)]  # order kept
    if budget >= estimate_transcript_tokens(summary_prompt(HISTORY)):
        assert prompt == summary_prompt(HISTORY)
    else:
        assert len(prompt) < len(summary_prompt(HISTORY))


def test_a_small_budget_leaves_out_the_middle_first() -> None:
    prompt = summary_prompt(HISTORY, budget_tokens=60)
    assert ToolResultRecord("c1", "read", "x" * 400) not in prompt
    assert ToolCallRecord("c1", "read", '{"path": "a.csv"}') not in prompt


def test_the_boundary_keeps_goal_and_latest_message_verbatim() -> None:
    boundary = summary_boundary("  The user is building a CSV importer.  ", HISTORY)
    assert boundary.summary.startswith("The user is building a CSV importer.")
    assert "User's goal: goal: write a CSV importer" in boundary.summary
    assert "Latest user message: latest: also handle quotes" in boundary.summary
    # A later compaction of a history that starts at this boundary carries the goal over.
    later = summary_boundary("more work done", [boundary, UserMessage("now JSON too")])
    assert "User's goal: goal: write a CSV importer" in later.summary
    assert "Latest user message: now JSON too" in later.summary


def summary_engine() -> ScriptedEngine:
    script = [MessageDelta("CSV importer; "), MessageDelta("quotes open."), USAGE, Completed()]
    return ScriptedEngine(native_compaction=False, turns=[script])


@pytest.mark.anyio
async def test_an_engine_without_native_compaction_is_summarised(tmp_path: Path) -> None:
    engine = summary_engine()
    assert not engine.supports_native_compaction
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        for item in HISTORY:
            await runtime.persist_turn_item(thread_id, "t1", item)
        history = await runtime.replay_history(thread_id)
        result = await runtime.compact_with_provider(thread_id, "t2", "scripted", None, history)
        assert result.mode == "summary" and result.attempts == 1
        assert result.usage == TokenUsage(50, 20, 70)
        assert isinstance(result.boundary, ContextCompaction)
        assert result.boundary.summary.startswith("CSV importer; quotes open.")
        ctx, request = engine.requests[0]
        assert (ctx.purpose, ctx.attempt) == ("compaction", 1)
        assert request.instructions == SUMMARY_INSTRUCTIONS and request.tools == ()
        assert list(request.transcript) == summary_prompt(HISTORY, budget_tokens=10**9)
        assert engine.compaction_requests == []
        assert await runtime.replay_history(thread_id) == [result.boundary]
        events = [e.event for e in await (await runtime.store()).read_events(thread_id)]
        assert CompactionStarted("t2", "summary") in events
        assert events[-1] == CompactionCommitted("t2", "summary")
        assert await runtime.usage_by_purpose(thread_id) == {"compaction": TokenUsage(50, 20, 70)}


INTERRUPTED = ProviderFailure(ProviderFailureKind.STREAM_INTERRUPTED, "reset")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("script", "reason", "attempts"),
    [
        ([MessageDelta("partial"), USAGE, Raise(INTERRUPTED)], "disconnected", 2),
        ([MessageDelta("partial"), USAGE, Failed("overloaded")], "failed", 1),
        (
            [MessageDelta("s"), USAGE, ToolCallCompleted("c", "shell", "{}"), Completed()],
            "tool_call",
            1,
        ),
        ([USAGE, Completed()], "no_boundary", 1),
        ([MessageDelta("   "), USAGE, Completed()], "no_boundary", 1),
        ([MessageDelta("summary"), USAGE], "not_completed", 1),
    ],
    ids=["interrupted", "failed", "tool-call", "no-text", "blank-text", "not-completed"],
)
async def test_summarising_compaction_is_transactional_too(
    tmp_path: Path, script: Script, reason: str, attempts: int
) -> None:
    def play(ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int) -> Script:
        return script

    engine = ScriptedEngine(native_compaction=False, turns=play)
    config = RuntimeConfig(
        reliability=ReliabilityConfig(
            provider_retry_max_attempts=2, provider_retry_initial_backoff_ms=0
        )
    )
    async with make_runtime(tmp_path / "threads", engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        for item in HISTORY:
            await runtime.persist_turn_item(thread_id, "t1", item)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t2", "scripted", None, HISTORY)
        assert caught.value.reason == reason
        assert len(engine.requests) == attempts
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == HISTORY
        assert snapshot.metadata.usage.total_tokens == 70 * attempts


@pytest.mark.anyio
@pytest.mark.parametrize(
    "script",
    [
        [MessageDelta("s" * 300), Usage(TokenUsage(50, 896, 946)), Completed()],
        [MessageDelta("s" * 2000), Completed()],  # no usage reported: the text's estimate
    ],
    ids=["reported-usage", "estimated"],
)
async def test_a_summary_over_its_output_cap_is_discarded(tmp_path: Path, script: Script) -> None:
    """The summarising call carries the cap (``max_output_tokens``: a quarter of a 400-token
    window); an answer over it is discarded (``too_large``), never committed."""

    def play(ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int) -> Script:
        return script

    engine = ScriptedEngine(native_compaction=False, turns=play, context_window=400)
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        for item in HISTORY[:2]:
            await runtime.persist_turn_item(thread_id, "t1", item)
        history = await runtime.replay_history(thread_id)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t2", "scripted", None, history)
        assert caught.value.reason == "too_large"
        assert "at most 100 tokens" in str(caught.value)
        (_, request) = engine.requests[0]
        assert request.max_output_tokens == 100
        assert await runtime.replay_history(thread_id) == history
        events = [e.event for e in await (await runtime.store()).read_events(thread_id)]
        assert not any(isinstance(e, CompactionCommitted) for e in events)


@pytest.mark.anyio
async def test_the_summarising_request_carries_the_output_cap(tmp_path: Path) -> None:
    engine = summary_engine()
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        for item in HISTORY:
            await runtime.persist_turn_item(thread_id, "t1", item)
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(thread_id, "t2", "scripted", None, history)
    (_, request) = engine.requests[0]
    assert request.max_output_tokens == 2000  # summary_max_tokens; the window is large
