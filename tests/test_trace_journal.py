"""What the journal keeps for traces: the response's id and finish reason, reasoning tokens,
time to first chunk from the events' times, compaction spans, and content only when opted in.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest

from roder_api.codec import from_dict, to_dict
from roder_api.events import (
    AssistantContentDelta,
    JournalEvent,
    ModelStepStarted,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import Completed, MessageDelta, TokenUsage, Usage
from roder_api.testing import Delay, ScriptedEngine
from roder_api.tracing import CAPTURE_CONTENT_VARIABLE, rebuild_traces
from roder_runtime import CompactionConfig, Runtime, RuntimeConfig

from .conftest import make_runtime, roder_command
from .test_compaction_auto import big_history, boundary, seeded

pytestmark = [pytest.mark.anyio, pytest.mark.core]

REASONED = TokenUsage(100, 40, 140, reasoning_tokens=30)


async def _events(runtime: Runtime, thread_id: str) -> list[JournalEvent]:
    return await (await runtime.journal(thread_id)).read_events()


async def test_the_response_id_finish_reason_and_reasoning_tokens_are_journaled(
    tmp_path: Path,
) -> None:
    script = [MessageDelta("seven"), Usage(REASONED), Completed("end_turn", "resp_42")]
    base = tmp_path / "threads"
    async with make_runtime(base, ScriptedEngine(turns=[script])) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "a prime?") == "seven"
    # A new runtime reads what the first one wrote: the fields survive the store's codec.
    async with make_runtime(base) as runtime:
        events = await _events(runtime, thread_id)
        snapshot = await runtime.load_thread(thread_id)
    assert snapshot is not None and snapshot.metadata.usage.reasoning_tokens == 30
    (usage,) = [e.event for e in events if isinstance(e.event, UsageUpdated)]
    assert usage == UsageUpdated(
        usage.turn_id,
        REASONED,
        "turn",
        "scripted-default",
        "scripted",
        response_id="resp_42",
        finish_reason="end_turn",
    )
    (trace,) = rebuild_traces(thread_id, events)
    root, chat = trace.spans
    assert chat.attributes["gen_ai.response.id"] == "resp_42"
    # The provider's own reason, not the "stop" the step's items would suggest.
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert chat.attributes["gen_ai.usage.reasoning.output_tokens"] == 30
    assert chat.attributes["gen_ai.usage.output_tokens"] == 40
    assert root.attributes["gen_ai.usage.reasoning.output_tokens"] == 30


async def test_a_failed_attempt_is_billed_without_a_response_id(tmp_path: Path) -> None:
    from roder_api.inference import ProviderFailure, ProviderFailureKind
    from roder_api.testing import Raise
    from roder_runtime import ReliabilityConfig

    failure = ProviderFailure(ProviderFailureKind.NETWORK, "reset")
    engine = ScriptedEngine(
        turns=[
            [Usage(TokenUsage(10, 1, 11)), Raise(failure)],
            [MessageDelta("ok"), Usage(TokenUsage(12, 2, 14)), Completed("stop", "resp_2")],
        ]
    )
    config = RuntimeConfig(reliability=ReliabilityConfig(provider_retry_initial_backoff_ms=0))
    async with make_runtime(tmp_path / "threads", engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "go") == "ok"
        events = await _events(runtime, thread_id)
    billed = [e.event for e in events if isinstance(e.event, UsageUpdated)]
    assert [(u.usage.total_tokens, u.response_id, u.finish_reason) for u in billed] == [
        (11, None, None),
        (14, "resp_2", "stop"),
    ]
    kinds = [type(e.event).__name__ for e in events]
    # The failed attempt's usage is journaled before the warning that it is retried.
    assert kinds.index("UsageUpdated") < kinds.index("WarningEvent")
    (trace,) = rebuild_traces(thread_id, events)
    failed, answered = trace.spans[1:]
    assert "gen_ai.response.id" not in failed.attributes and failed.error is not None
    assert answered.attributes["gen_ai.response.id"] == "resp_2"


def test_journals_written_before_the_fields_still_read() -> None:
    old_usage = {
        "type": "token_usage",
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "cached_prompt_tokens": 0,
        "cache_creation_prompt_tokens": 0,
    }
    old = {
        "type": "usage_updated",
        "turn_id": "t1",
        "usage": old_usage,
        "purpose": "turn",
        "model": "m",
        "provider": "p",
    }
    event = from_dict(old)
    assert event == UsageUpdated("t1", TokenUsage(5, 2, 7), "turn", "m", "p")
    assert event.response_id is None and event.finish_reason is None
    assert event.usage.reasoning_tokens == 0 and not event.unknown_fields
    new = UsageUpdated("t1", REASONED, response_id="r", finish_reason="stop")
    assert from_dict(to_dict(new)) == new
    # A field from a newer version is kept through a round trip, as every record's are.
    newer = from_dict({**to_dict(new), "response_model": "m-2025"})
    assert to_dict(newer)["response_model"] == "m-2025"
    # A journal without the fields traces as before: no response id on its spans.
    journal = [
        JournalEvent(1, 1000, TurnStarted("t1")),
        JournalEvent(2, 1001, ModelStepStarted("t1", "s1", "m", "p")),
        JournalEvent(3, 1002, event),
    ]
    (trace,) = rebuild_traces("thread", journal)
    assert "gen_ai.response.id" not in trace.spans[1].attributes


async def test_time_to_first_chunk_is_the_time_between_the_events(tmp_path: Path) -> None:
    script = [Delay(0.3), MessageDelta("late"), Usage(TokenUsage(1, 1, 2)), Completed()]
    async with make_runtime(tmp_path / "threads", ScriptedEngine(turns=[script])) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "go")
        events = await _events(runtime, thread_id)
    started = next(e for e in events if isinstance(e.event, ModelStepStarted))
    first = next(e for e in events if isinstance(e.event, AssistantContentDelta))
    (trace,) = rebuild_traces(thread_id, events)
    chat = trace.spans[1]
    expected = (first.recorded_at_ms - started.recorded_at_ms) / 1000
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] == expected
    assert chat.start_ms == started.recorded_at_ms
    assert expected >= 0.25  # the engine waited 0.3 s before its first chunk


async def test_compaction_spans_standalone_and_in_a_turn(tmp_path: Path) -> None:
    usage = Usage(TokenUsage(30, 10, 40))
    engine = ScriptedEngine(
        compactions=[
            [boundary("cmp_turn"), usage, Completed("compacted", "resp_cmp_turn")],
            [boundary("cmp_alone"), usage, Completed("compacted", "resp_cmp_alone")],
        ],
        context_window=1000,
    )
    config = RuntimeConfig(compaction=CompactionConfig(auto_compact_fraction=0.5))
    async with make_runtime(tmp_path / "threads", engine, config=config) as runtime:
        thread_id = await seeded(runtime, big_history(4))
        assert await runtime.run_turn(thread_id, "next", engine="scripted")
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(
            thread_id, "compaction_1", "scripted", "scripted-default", history
        )
        events = await _events(runtime, thread_id)
    in_turn, alone = rebuild_traces(thread_id, events)
    assert [s.name for s in in_turn.spans] == [
        "invoke_agent roder",
        "chat scripted-default",
        "chat scripted-default",
    ]
    compaction, answer = in_turn.spans[1:]
    assert compaction.parent_span_id == in_turn.root.span_id
    assert compaction.kind == "CLIENT"
    assert compaction.attributes["roder.purpose"] == "compaction"
    assert compaction.attributes["roder.compaction.mode"] == "native"
    assert compaction.attributes["gen_ai.response.id"] == "resp_cmp_turn"
    assert compaction.attributes["gen_ai.response.finish_reasons"] == ["compacted"]
    assert compaction.attributes["gen_ai.usage.input_tokens"] == 30
    assert compaction.end_ms <= answer.start_ms
    assert "roder.purpose" not in answer.attributes
    # `roder compact` (no turn): a trace of its own, whose root is the compaction's chat span.
    assert [s.name for s in alone.spans] == ["chat scripted-default"]
    root = alone.root
    assert root.parent_span_id is None and root.error is None
    assert root.attributes["roder.purpose"] == "compaction"
    assert root.attributes["gen_ai.operation.name"] == "chat"
    assert root.attributes["gen_ai.response.id"] == "resp_cmp_alone"
    assert root.attributes["gen_ai.usage.output_tokens"] == 10
    assert alone.trace_id != in_turn.trace_id


async def test_content_is_traced_only_when_the_variable_opts_in(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    base = tmp_path / "threads"
    async with make_runtime(base) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "secret question")
    env = {**cli_env, "RODER_THREADS_PATH": str(base)}
    env.pop(CAPTURE_CONTENT_VARIABLE, None)

    def trace(extra: dict[str, str]) -> str:
        done = subprocess.run(
            [*roder_command(), "threads", "trace", thread_id],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    for value, shown in [(None, False), ("false", False), ("true", True), ("span_only", True)]:
        text = await anyio.to_thread.run_sync(
            trace, {} if value is None else {CAPTURE_CONTENT_VARIABLE: value}
        )
        spans = json.loads(text)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        keys = {a["key"] for s in spans for a in s["attributes"]}
        assert ("gen_ai.input.messages" in keys) is shown, value
        assert ("gen_ai.output.messages" in keys) is shown, value
        assert ("secret question" in text) is shown, value
