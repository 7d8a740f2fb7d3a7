"""Compaction exported live: a ``chat`` span with ``roder.purpose = compaction``, in a turn
and on its own (``roder compact``), with the provider's response id and the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from roder_api.events import ItemCompleted
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import Completed, TokenUsage, Usage
from roder_api.testing import ScriptedEngine
from roder_api.transcript import AssistantMessage, ProviderMetadata, TranscriptItem, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_otel import OtelObserver
from roder_runtime import CompactionConfig, Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


def _boundary(cmp_id: str) -> ProviderMetadata:
    item = {"type": "compaction", "id": cmp_id, "encrypted_content": "e" * 16}
    return ProviderMetadata({"output": [item], "compacted_input": [item]})


def _big_history() -> list[TranscriptItem]:
    """Four messages of about 129 estimated tokens each: over half a 1000-token window."""
    texts = [f"message {n} " + "w" * 490 for n in range(4)]
    return [UserMessage(t) if n % 2 == 0 else AssistantMessage(t) for n, t in enumerate(texts)]


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_compaction_spans_are_exported_in_a_turn_and_on_their_own(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    observer = OtelObserver(tracer_provider, MeterProvider(metric_readers=[reader]))
    usage = Usage(TokenUsage(30, 10, 40))
    engine = ScriptedEngine(
        compactions=[
            [_boundary("cmp_turn"), usage, Completed("compacted", "resp_cmp_turn")],
            [_boundary("cmp_alone"), usage, Completed("compacted", "resp_cmp_alone")],
        ],
        context_window=1000,
    )
    builder = ExtensionRegistryBuilder().observer(observer).inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    config = RuntimeConfig(compaction=CompactionConfig(auto_compact_fraction=0.5))
    async with Runtime(builder.build(), config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.append_events(thread_id, [ItemCompleted("t0", i) for i in _big_history()])
        assert await runtime.run_turn(thread_id, "next", engine="scripted")
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(
            thread_id, "compaction_1", "scripted", "scripted-default", history
        )
    # Closing the runtime handed the observer every batch.
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    roots = [s for s in spans if s.parent is None]
    assert [s.name for s in roots] == ["invoke_agent roder", "chat scripted-default"]
    turn, alone = roots
    children = [s for s in spans if s.parent is not None]
    assert all(s.parent is not None and s.parent.span_id == turn.context.span_id for s in children)
    compaction, answer = children
    assert compaction.name == "chat scripted-default"
    found = _attributes(compaction)
    assert found["roder.purpose"] == "compaction"
    assert found["roder.compaction.mode"] == "native"
    assert found["gen_ai.response.id"] == "resp_cmp_turn"
    assert found["gen_ai.response.finish_reasons"] == ("compacted",)
    assert found["gen_ai.usage.input_tokens"] == 30
    assert "roder.purpose" not in _attributes(answer)
    assert (compaction.end_time or 0) <= (answer.start_time or 0)
    # roder compact: a trace of its own whose root is the compaction's chat span.
    assert alone.context.trace_id != turn.context.trace_id
    found = _attributes(alone)
    assert found["roder.purpose"] == "compaction"
    assert found["gen_ai.operation.name"] == "chat"
    assert found["gen_ai.response.id"] == "resp_cmp_alone"
    assert found["gen_ai.conversation.id"] == thread_id
    data = reader.get_metrics_data()
    assert data is not None
    durations = [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "gen_ai.client.operation.duration"
        for point in metric.data.data_points  # type: ignore[union-attr]
    ]
    assert sum(p.count for p in durations) == 3  # two compactions and the turn's model call
