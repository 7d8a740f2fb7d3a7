"""Automatic compaction before a model call, its failure paths and its hysteresis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnStarted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceTurnContext,
    MessageDelta,
    TokenUsage,
    Usage,
)
from roder_api.testing import Script, ScriptedEngine, default_reply
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    TranscriptItem,
    UserMessage,
)
from roder_runtime import CompactionConfig, Runtime, RuntimeConfig
from roder_runtime.compaction._auto import auto_compaction_due, maybe_auto_compact
from roder_runtime.compaction._estimates import estimate_transcript_tokens
from roder_runtime.compaction._summary import SUMMARY_INSTRUCTIONS
from roder_runtime.store._journal import ThreadJournal

from .conftest import make_runtime

pytestmark = pytest.mark.anyio

WINDOW = 1000
USAGE = Usage(TokenUsage(30, 10, 40))


def boundary(cmp_id: str, padding: int = 0) -> ProviderMetadata:
    item = {"type": "compaction", "id": cmp_id, "encrypted_content": "e" * (16 + padding)}
    return ProviderMetadata({"output": [item], "compacted_input": [item]})


def big_history(items: int) -> list[TranscriptItem]:
    """Return ``items`` alternating messages of about 129 estimated tokens each."""
    history: list[TranscriptItem] = []
    for index in range(items):
        text = f"message {index} " + "w" * 490
        history.append(UserMessage(text) if index % 2 == 0 else AssistantMessage(text))
    return history


def config(fraction: float = 0.5) -> RuntimeConfig:
    return RuntimeConfig(compaction=CompactionConfig(auto_compact_fraction=fraction))


async def seeded(runtime: Runtime, items: list[TranscriptItem]) -> str:
    thread_id = (await runtime.create_thread()).thread_id
    await runtime.append_events(thread_id, [ItemCompleted("t0", item) for item in items])
    return thread_id


async def events_of(runtime: Runtime, thread_id: str, after: int = 0) -> list[object]:
    return [e.event for e in await (await runtime.store()).read_events(thread_id, after=after)]


async def test_a_turn_over_the_threshold_compacts_first(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        compactions=[[boundary("cmp_auto"), USAGE, Completed()]], context_window=WINDOW
    )
    history = big_history(4)
    assert estimate_transcript_tokens(history) > 0.5 * WINDOW
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, history)
        reply = await runtime.run_turn(thread_id, "next step", engine="scripted")
        assert reply == "You said: next step"
        assert len(engine.compaction_requests) == 1
        assert list(engine.compaction_requests[0][1].transcript) == history
        _, request = engine.requests[-1]
        assert list(request.transcript) == [boundary("cmp_auto"), UserMessage("next step")]
        events = await events_of(runtime, thread_id, after=len(history))
        kinds = [type(e) for e in events]
        assert kinds[:7] == [
            TurnStarted,
            CompactionStarted,
            ItemCompleted,
            UsageUpdated,
            CompactionCommitted,
            ItemCompleted,
            ModelStepStarted,
        ]
        assert events[2] == ItemCompleted(events[0].turn_id, boundary("cmp_auto"))  # type: ignore[attr-defined]
        assert events[5] == ItemCompleted(events[0].turn_id, UserMessage("next step"))  # type: ignore[attr-defined]
        # The next turn is small again: no second compaction.
        await runtime.run_turn(thread_id, "and then?", engine="scripted")
        assert len(engine.compaction_requests) == 1
        usage = await runtime.usage_by_purpose(thread_id)
        assert usage["compaction"] == TokenUsage(30, 10, 40) and "turn" in usage


async def test_hysteresis_no_loop_when_the_boundary_itself_is_big(tmp_path: Path) -> None:
    # Each compaction yields a boundary above the threshold (but inside the window).
    big = boundary("cmp_big", padding=2_400)
    assert 0.5 * WINDOW < estimate_transcript_tokens([big]) < 0.9 * WINDOW
    engine = ScriptedEngine(
        compactions=[[big, USAGE, Completed()]], repeat_last=True, context_window=WINDOW
    )
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, big_history(4))
        compacted_on = []
        for turn in range(12):
            before = len(engine.compaction_requests)
            assert await runtime.run_turn(thread_id, f"turn {turn} " + "y" * 40, engine="scripted")
            if len(engine.compaction_requests) > before:
                compacted_on.append(turn)
        # Turn 0 compacts the big history. The boundary alone is over the threshold, yet the
        # next turns do not compact again at once: only after about REARM_FRACTION of the
        # window was added on top of the boundary, so never on two turns in a row.
        assert compacted_on[0] == 0 and len(compacted_on) >= 2
        assert all(b - a >= 2 for a, b in zip(compacted_on, compacted_on[1:], strict=False))
        assert len(compacted_on) <= 6


async def test_a_failed_compaction_continues_when_the_history_fits(tmp_path: Path) -> None:
    engine = ScriptedEngine(compactions=[[USAGE, Failed("no")]], context_window=WINDOW)
    history = big_history(4)
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, history)
        reply = await runtime.run_turn(thread_id, "go on", engine="scripted")
        assert reply == "You said: go on"
        _, request = engine.requests[-1]
        assert list(request.transcript) == [*history, UserMessage("go on")]
        events = await events_of(runtime, thread_id, after=len(history))
        assert CompactionDiscarded("failed", events[0].turn_id) in events  # type: ignore[attr-defined]
        warnings = [e for e in events if isinstance(e, WarningEvent)]
        assert len(warnings) == 1 and "continuing on the uncompacted history" in warnings[0].message
        assert (await runtime.usage_by_purpose(thread_id))[
            "discarded_compaction"
        ].total_tokens == 40
        assert await runtime.replay_history(thread_id) == [
            *history,
            UserMessage("go on"),
            AssistantMessage("You said: go on"),
        ]


async def test_a_failed_compaction_fails_the_turn_when_the_history_does_not_fit(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine(compactions=[[USAGE, Failed("no")]], context_window=WINDOW)
    history = big_history(9)
    assert estimate_transcript_tokens(history) > WINDOW
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, history)
        assert await runtime.run_turn(thread_id, "help", engine="scripted") is None
        assert engine.requests == []  # no model call on a history that cannot fit
        events = await events_of(runtime, thread_id, after=len(history))
        turn_id = events[0].turn_id  # type: ignore[attr-defined]
        assert events[-3:-1] == [
            ItemCompleted(turn_id, UserMessage("help")),
            events[-2],
        ]
        error = events[-2]
        assert isinstance(error, ErrorEvent)
        assert "does not fit the context window" in error.message and "failed" in error.message
        assert events[-1] == TurnAborted(turn_id, "failed")
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == [*history, UserMessage("help")]
        assert snapshot.metadata.usage.total_tokens == 40


async def test_summarising_auto_compaction_for_engines_without_native(tmp_path: Path) -> None:
    def play(ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int) -> Script:
        if ctx.purpose == "compaction":
            return [MessageDelta("long talk about w"), USAGE, Completed()]
        return default_reply(request)

    engine = ScriptedEngine(native_compaction=False, turns=play, context_window=WINDOW)
    history = big_history(4)
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, history)
        assert await runtime.run_turn(thread_id, "continue", engine="scripted")
        (compaction_ctx, compaction), (turn_ctx, turn) = engine.requests
        assert compaction_ctx.purpose == "compaction" and turn_ctx.purpose == "turn"
        assert compaction.instructions == SUMMARY_INSTRUCTIONS
        first, second = turn.transcript
        assert isinstance(first, ContextCompaction)
        assert first.summary.startswith("long talk about w")
        assert "User's goal: message 0 " in first.summary
        assert second == UserMessage("continue")


async def test_auto_compaction_can_be_disabled_or_have_no_window(tmp_path: Path) -> None:
    engine = ScriptedEngine(context_window=WINDOW)
    history = big_history(4)
    async with make_runtime(tmp_path / "threads", engine, config=config(0.0)) as runtime:
        assert not await auto_compaction_due(runtime.catalog, engine, "scripted-1", history)
        assert await auto_compaction_due(runtime.catalog, engine, "unknown-model", history) is False
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        assert await auto_compaction_due(runtime.catalog, engine, "scripted-1", history)
        # An unlisted model of an engine whose models share one window gets that window.
        assert await auto_compaction_due(runtime.catalog, engine, "unlisted-model", history)
        assert not await auto_compaction_due(runtime.catalog, engine, "scripted-1", [])
        unknown = ScriptedEngine(id="no-window", context_window=0)
        assert not await auto_compaction_due(runtime.catalog, unknown, "scripted-1", history)


async def test_maybe_auto_compact_is_a_hook_for_other_turn_loops(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        compactions=[[boundary("cmp_hook"), USAGE, Completed()]], context_window=WINDOW
    )
    history = big_history(4)
    recorded: list[object] = []
    async with make_runtime(tmp_path / "threads", engine, config=config()) as runtime:
        thread_id = await seeded(runtime, history)

        class Recording(ThreadJournal):
            async def append(
                self, events: Sequence[Event], *, expected_last_sequence: int | None = None
            ) -> list[JournalEvent]:
                entries = await super().append(
                    events, expected_last_sequence=expected_last_sequence
                )
                recorded.extend(e.event for e in entries)
                return entries

        plain = await runtime.journal(thread_id)
        journal = Recording(plain.store, thread_id, store_name=plain.store_name)
        catalog = runtime.catalog
        small = await maybe_auto_compact(journal, catalog, "t1", engine, "scripted-1", history[:1])
        assert small == history[:1] and recorded == []
        compacted = await maybe_auto_compact(journal, catalog, "t1", engine, "scripted-1", history)
        assert compacted == [boundary("cmp_hook")]
        assert [type(e) for e in recorded] == [
            CompactionStarted,
            ItemCompleted,
            UsageUpdated,
            CompactionCommitted,
        ]
