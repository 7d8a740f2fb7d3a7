"""Transactional native compaction: commit only after a clean stream, bill every attempt."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import orjson
import pytest

from roder_api.errors import CompactionFailed, CompactionPreempted
from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ItemCompleted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.testing import Delay, Hang, Raise, Script, ScriptedEngine, ScriptFunction
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    TranscriptItem,
    UserMessage,
    trim_to_last_compaction_boundary,
)
from roder_runtime import CompactionResult, ReliabilityConfig, Runtime, RuntimeConfig

from .conftest import make_runtime

pytestmark = pytest.mark.anyio

ORIGINAL: list[TranscriptItem] = [
    UserMessage("build me a parser"),
    AssistantMessage("which grammar?"),
    UserMessage("JSON, please"),
    AssistantMessage("here is a JSON parser"),
]


def boundary(cmp_id: str) -> ProviderMetadata:
    item = {"type": "compaction", "id": cmp_id, "encrypted_content": f"enc-{cmp_id}"}
    kept = [{"type": "message", "role": "user", "content": "JSON, please"}]
    return ProviderMetadata({"output": [item], "compacted_input": [*kept, item]})


BOUNDARY = boundary("cmp_1")
OTHER_BOUNDARY = boundary("cmp_2")
USAGE = Usage(TokenUsage(30, 10, 40))
INTERRUPTED = ProviderFailure(ProviderFailureKind.STREAM_INTERRUPTED, "connection reset")


def signalling(script: Script, opened: anyio.Event) -> ScriptFunction:
    """Return a compaction script function that sets ``opened`` when the stream starts.

    The scripted generator then runs without a checkpoint until its first ``Hang`` or
    ``Delay``, so a task woken by ``opened`` runs only once the stream is blocked there.
    """

    def play(ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int) -> Script:
        opened.set()
        return script

    return play


def config(max_attempts: int = 2, backoff_ms: int = 0) -> RuntimeConfig:
    return RuntimeConfig(
        reliability=ReliabilityConfig(
            provider_retry_max_attempts=max_attempts,
            provider_retry_initial_backoff_ms=backoff_ms,
        )
    )


async def seed(runtime: Runtime, items: Sequence[TranscriptItem] = ORIGINAL) -> str:
    thread_id = (await runtime.create_thread()).thread_id
    for index, item in enumerate(items):
        await runtime.persist_turn_item(thread_id, f"t{index // 2}", item)
    return thread_id


async def journal(runtime: Runtime, thread_id: str) -> list[object]:
    return [e.event for e in await (await runtime.store()).read_events(thread_id)]


async def assert_unchanged(runtime: Runtime, thread_id: str, tokens: int) -> None:
    snapshot = await runtime.load_thread(thread_id)
    assert snapshot is not None
    assert snapshot.items == ORIGINAL
    assert trim_to_last_compaction_boundary(snapshot.items) == ORIGINAL
    assert await runtime.replay_history(thread_id) == ORIGINAL
    assert snapshot.metadata.usage.total_tokens == tokens


# --- the "Done when" cases (a)-(d) ---------------------------------------------------

DONE_WHEN_CASES = {
    # (a) a retryable failure: retried once (max_attempts = 2), both attempts billed
    "a-stream-interrupted": ([BOUNDARY, USAGE, Raise(INTERRUPTED)], "disconnected", 2),
    # (b)-(d) are not ProviderFailures: the provider answered, so they are not retried
    "b-failed": ([BOUNDARY, USAGE, Failed("compaction failed upstream")], "failed", 1),
    "c-conflicting-boundary": (
        [BOUNDARY, USAGE, OTHER_BOUNDARY, Completed()],
        "conflicting_boundary",
        1,
    ),
    "d-tool-call": ([BOUNDARY, USAGE, ToolCallCompleted("call_1", "shell", "{}")], "tool_call", 1),
    "d-tool-call-then-completed": (
        [BOUNDARY, USAGE, ToolCallCompleted("call_1", "shell", "{}"), Completed()],
        "tool_call",
        1,
    ),
}


@pytest.mark.parametrize("case", list(DONE_WHEN_CASES))
async def test_a_bad_compaction_stream_is_discarded_and_every_attempt_billed(
    tmp_path: Path, case: str
) -> None:
    script, reason, attempts = DONE_WHEN_CASES[case]
    engine = ScriptedEngine(compactions=[script], repeat_last=True, requires_native_compaction=True)
    runtime = make_runtime(tmp_path / "threads", engine, config=config())
    try:
        thread_id = await seed(runtime)
        history = await runtime.replay_history(thread_id)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t9", "scripted", "scripted-1", history)
        assert caught.value.reason == reason
        assert caught.value.attempts == attempts
        assert caught.value.usage == TokenUsage(30 * attempts, 10 * attempts, 40 * attempts)
        assert reason in str(caught.value) and "unchanged" in str(caught.value)
        assert len(engine.compaction_requests) == attempts
        assert engine.requests == []  # never summarised through stream_turn
        assert engine.open_streams == 0
        await assert_unchanged(runtime, thread_id, 40 * attempts)
        events = await journal(runtime, thread_id)
        assert events[len(ORIGINAL)] == CompactionStarted("t9", "native")
        assert events[-1] == CompactionDiscarded(reason, "t9")
        assert not any(isinstance(e, CompactionCommitted) for e in events)
        assert await runtime.usage_by_purpose(thread_id) == {
            "discarded_compaction": TokenUsage(30 * attempts, 10 * attempts, 40 * attempts)
        }
    finally:
        await runtime.aclose()
    # The same after a restart: a new Runtime on the same directory.
    reopened = make_runtime(tmp_path / "threads", ScriptedEngine(), config=config())
    try:
        await assert_unchanged(reopened, thread_id, 40 * attempts)
    finally:
        await reopened.aclose()


async def test_e_preempt_cancels_a_stream_blocked_forever(tmp_path: Path) -> None:
    opened = anyio.Event()
    engine = ScriptedEngine(
        compactions=signalling([BOUNDARY, USAGE, Hang()], opened),
        requires_native_compaction=True,
    )
    runtime = make_runtime(tmp_path / "threads", engine, config=config())
    try:
        thread_id = await seed(runtime)
        history = await runtime.replay_history(thread_id)
        preempt = anyio.Event()
        caught: list[BaseException] = []

        async def compact() -> None:
            try:
                await runtime.compact_with_provider(
                    thread_id, "t9", "scripted", "scripted-1", history, preempt=preempt
                )
            except CompactionPreempted as exc:
                caught.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(compact)
                await opened.wait()  # the boundary and usage are staged; the stream hangs
                assert engine.open_streams == 1
                preempt.set()
        (error,) = caught
        assert isinstance(error, CompactionPreempted)
        assert error.reason == "preempted" and error.attempts == 1
        assert engine.open_streams == 0 and engine.closed_streams == 1
        await assert_unchanged(runtime, thread_id, 40)
        events = await journal(runtime, thread_id)
        assert events[-2:] == [
            UsageUpdated(
                "t9", TokenUsage(30, 10, 40), "discarded_compaction", "scripted-1", "scripted"
            ),
            CompactionDiscarded("preempted", "t9"),
        ]
    finally:
        await runtime.aclose()
    reopened = make_runtime(tmp_path / "threads", ScriptedEngine())
    try:
        await assert_unchanged(reopened, thread_id, 40)
    finally:
        await reopened.aclose()


# --- commit -----------------------------------------------------------------------------------


async def test_a_clean_stream_commits_boundary_and_usage_in_one_batch(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        compactions=[[BOUNDARY, BOUNDARY, USAGE, Completed()]], requires_native_compaction=True
    )
    runtime = make_runtime(tmp_path / "threads", engine, config=config())
    try:
        thread_id = await seed(runtime)
        history = await runtime.replay_history(thread_id)
        result = await runtime.compact_with_provider(
            thread_id, "t9", "scripted", "scripted-1", history
        )
        assert result == CompactionResult(BOUNDARY, TokenUsage(30, 10, 40), 1, "native")
        ctx, request = engine.compaction_requests[0]
        assert (ctx.purpose, ctx.attempt, ctx.turn_id) == ("compaction", 1, "t9")
        assert list(request.transcript) == ORIGINAL
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        assert snapshot.items == [*ORIGINAL, BOUNDARY]
        assert snapshot.metadata.usage.total_tokens == 40
        assert await runtime.replay_history(thread_id) == [BOUNDARY]
        entries = await (await runtime.store()).read_events(thread_id)
        assert [e.event for e in entries[-3:]] == [
            ItemCompleted("t9", BOUNDARY),
            UsageUpdated("t9", TokenUsage(30, 10, 40), "compaction", "scripted-1", "scripted"),
            CompactionCommitted("t9", "native"),
        ]
        # One atomic batch: the JSONL store writes one line per batch.
        path = next((tmp_path / "threads").rglob(f"*{thread_id}*.jsonl"))
        batches = [orjson.loads(line)["r"] for line in path.read_bytes().splitlines()]
        last = [b for b in batches if b.get("k") == "events"][-1]
        assert [e["type"] for e in last["events"]] == [
            "item_completed",
            "usage_updated",
            "compaction_committed",
        ]
        assert await runtime.usage_by_purpose(thread_id) == {"compaction": TokenUsage(30, 10, 40)}
    finally:
        await runtime.aclose()


async def test_after_a_commit_the_next_request_starts_with_the_boundary(tmp_path: Path) -> None:
    engine = ScriptedEngine(compactions=[[BOUNDARY, USAGE, Completed()]])
    runtime = make_runtime(tmp_path / "threads", engine, config=config())
    try:
        thread_id = await seed(runtime)
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(thread_id, "t9", "scripted", "scripted-1", history)
        reply = await runtime.run_turn(thread_id, "and now YAML", engine="scripted")
        assert reply == "You said: and now YAML"
        _, request = engine.requests[-1]
        assert list(request.transcript) == [BOUNDARY, UserMessage("and now YAML")]
        assert request.transcript[0].data["compacted_input"][0]["content"] == "JSON, please"
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        assert snapshot.items[: len(ORIGINAL) + 1] == [*ORIGINAL, BOUNDARY]
        usage = await runtime.usage_by_purpose(thread_id)
        assert set(usage) == {"compaction", "turn"}
        assert snapshot.metadata.usage == usage["compaction"] + usage["turn"]
    finally:
        await runtime.aclose()


async def test_the_default_scripted_compaction_commits(runtime: Runtime) -> None:
    thread_id = await seed(runtime)
    result = await runtime.compact_with_provider(
        thread_id, "t9", "scripted", None, await runtime.replay_history(thread_id)
    )
    assert result.attempts == 1 and result.mode == "native"
    assert await runtime.replay_history(thread_id) == [result.boundary]


# --- discard reasons --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ([USAGE, Completed()], "no_boundary"),
        ([BOUNDARY, USAGE], "not_completed"),
        ([BOUNDARY, MessageDelta("text"), USAGE], "not_completed"),
        ([BOUNDARY, USAGE, Raise(RuntimeError("engine bug"))], "failed"),
        (
            [
                BOUNDARY,
                USAGE,
                Raise(ProviderFailure(ProviderFailureKind.AUTHENTICATION, "bad key")),
            ],
            "disconnected",
        ),
    ],
    ids=["no-boundary", "not-completed", "text-then-end", "engine-bug", "non-retryable"],
)
async def test_other_discards_are_not_retried(tmp_path: Path, script: Script, reason: str) -> None:
    engine = ScriptedEngine(compactions=[script], repeat_last=True)
    runtime = make_runtime(tmp_path / "threads", engine, config=config(max_attempts=3))
    try:
        thread_id = await seed(runtime)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t9", "scripted", "scripted-1", ORIGINAL)
        assert caught.value.reason == reason
        assert len(engine.compaction_requests) == 1
        await assert_unchanged(runtime, thread_id, 40)
    finally:
        await runtime.aclose()


# --- retries ----------------------------------------------------------------------------------


async def test_a_retried_compaction_commits_and_bills_every_attempt(tmp_path: Path) -> None:
    overloaded = ProviderFailure(ProviderFailureKind.OVERLOADED, "busy")
    engine = ScriptedEngine(
        compactions=[
            [BOUNDARY, USAGE, Raise(INTERRUPTED)],
            [USAGE, Raise(overloaded)],
            [OTHER_BOUNDARY, USAGE, Completed()],
        ]
    )
    runtime = make_runtime(tmp_path / "threads", engine, config=config(max_attempts=3))
    try:
        thread_id = await seed(runtime)
        result = await runtime.compact_with_provider(
            thread_id, "t9", "scripted", "scripted-1", ORIGINAL
        )
        assert result.boundary == OTHER_BOUNDARY and result.attempts == 3
        assert result.usage == TokenUsage(90, 30, 120)
        assert [ctx.attempt for ctx, _ in engine.compaction_requests] == [1, 2, 3]
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == [*ORIGINAL, OTHER_BOUNDARY]
        assert snapshot.metadata.usage.total_tokens == 120
        assert await runtime.usage_by_purpose(thread_id) == {
            "compaction": TokenUsage(30, 10, 40),
            "discarded_compaction": TokenUsage(60, 20, 80),
        }
        warnings = [e for e in await journal(runtime, thread_id) if isinstance(e, WarningEvent)]
        assert len(warnings) == 2 and "retrying" in warnings[0].message
    finally:
        await runtime.aclose()


async def test_retries_stop_at_max_attempts(tmp_path: Path) -> None:
    engine = ScriptedEngine(compactions=[[USAGE, Raise(INTERRUPTED)]], repeat_last=True)
    runtime = make_runtime(tmp_path / "threads", engine, config=config(max_attempts=4))
    try:
        thread_id = await seed(runtime)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t9", "scripted", "scripted-1", ORIGINAL)
        assert caught.value.reason == "disconnected" and caught.value.attempts == 4
        assert isinstance(caught.value.__cause__, ProviderFailure)
        await assert_unchanged(runtime, thread_id, 160)
    finally:
        await runtime.aclose()


async def test_retry_after_is_honoured(tmp_path: Path) -> None:
    limited = ProviderFailure(ProviderFailureKind.RATE_LIMITED, "slow down", retry_after=0.3)
    engine = ScriptedEngine(compactions=[[Raise(limited)], [BOUNDARY, USAGE, Completed()]])
    runtime = make_runtime(tmp_path / "threads", engine, config=config(max_attempts=2))
    try:
        thread_id = await seed(runtime)
        started = time.monotonic()
        result = await runtime.compact_with_provider(
            thread_id, "t9", "scripted", "scripted-1", ORIGINAL
        )
        # A lower bound only: the retry waited at least what the provider asked for.
        assert time.monotonic() - started >= 0.3
        assert result.attempts == 2 and result.usage == TokenUsage(30, 10, 40)
    finally:
        await runtime.aclose()


async def test_preempt_during_backoff_stops_at_once(tmp_path: Path) -> None:
    opened = anyio.Event()
    engine = ScriptedEngine(compactions=signalling([USAGE, Raise(INTERRUPTED)], opened))
    runtime = make_runtime(
        tmp_path / "threads", engine, config=config(max_attempts=3, backoff_ms=60_000)
    )
    try:
        thread_id = await seed(runtime)
        preempt = anyio.Event()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def steer() -> None:
                    await opened.wait()
                    preempt.set()

                tg.start_soon(steer)
                with pytest.raises(CompactionPreempted):
                    await runtime.compact_with_provider(
                        thread_id, "t9", "scripted", "scripted-1", ORIGINAL, preempt=preempt
                    )
        assert len(engine.compaction_requests) == 1
        await assert_unchanged(runtime, thread_id, 40)
        assert (await journal(runtime, thread_id))[-1] == CompactionDiscarded("preempted", "t9")
    finally:
        await runtime.aclose()


# --- preemption and cancellation ------------------------------------------------------------------


async def test_preempt_already_set_calls_no_engine(
    runtime: Runtime, engine: ScriptedEngine
) -> None:
    thread_id = await seed(runtime)
    preempt = anyio.Event()
    preempt.set()
    with pytest.raises(CompactionPreempted) as caught:
        await runtime.compact_with_provider(
            thread_id, "t9", "scripted", None, ORIGINAL, preempt=preempt
        )
    assert caught.value.attempts == 0 and caught.value.usage == TokenUsage()
    assert engine.compaction_requests == []
    await assert_unchanged(runtime, thread_id, 0)


async def test_outside_cancellation_still_bills_and_discards(tmp_path: Path) -> None:
    engine = ScriptedEngine(compactions=[[BOUNDARY, USAGE, Hang()]])
    runtime = make_runtime(tmp_path / "threads", engine)
    try:
        thread_id = await seed(runtime)
        with anyio.move_on_after(0.2) as scope:
            await runtime.compact_with_provider(thread_id, "t9", "scripted", "scripted-1", ORIGINAL)
        assert scope.cancelled_caught
        assert engine.open_streams == 0
        await assert_unchanged(runtime, thread_id, 40)
        assert (await journal(runtime, thread_id))[-1] == CompactionDiscarded("preempted", "t9")
    finally:
        await runtime.aclose()


async def test_items_added_while_compacting_discard_the_candidate(tmp_path: Path) -> None:
    opened = anyio.Event()
    engine = ScriptedEngine(
        compactions=signalling([BOUNDARY, USAGE, Delay(0.3), Completed()], opened)
    )
    runtime = make_runtime(tmp_path / "threads", engine)
    try:
        thread_id = await seed(runtime)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def write_meanwhile() -> None:
                    await opened.wait()
                    await runtime.persist_turn_item(thread_id, "t5", UserMessage("wait!"))

                tg.start_soon(write_meanwhile)
                with pytest.raises(CompactionPreempted) as caught:
                    await runtime.compact_with_provider(
                        thread_id, "t9", "scripted", "scripted-1", ORIGINAL
                    )
        assert "added to the thread" in str(caught.value)
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == [*ORIGINAL, UserMessage("wait!")]
        assert snapshot.metadata.usage.total_tokens == 40
    finally:
        await runtime.aclose()


# --- engines that require native compaction -------------------------------------------------------


class NativeOnlyWithoutCompaction(InferenceEngine):
    """Requires native compaction but does not implement it: it must never be summarised."""

    id = "native-only"
    requires_native_compaction = True

    def __init__(self) -> None:
        self.turns = 0

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        self.turns += 1
        yield MessageDelta("a summary")
        yield Completed()


async def test_requires_native_compaction_is_never_summarised(tmp_path: Path) -> None:
    from roder_api import ExtensionRegistryBuilder
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    engine = NativeOnlyWithoutCompaction()
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    async with Runtime(builder.build()) as runtime:
        thread_id = await seed(runtime)
        with pytest.raises(CompactionFailed) as caught:
            await runtime.compact_with_provider(thread_id, "t9", "native-only", "m", ORIGINAL)
        assert "requires native compaction" in str(caught.value)
        assert engine.turns == 0
        await assert_unchanged(runtime, thread_id, 0)
