"""roder-otel against the OpenTelemetry SDK: in-memory exporters, and a real OTLP/HTTP receiver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from otel_collector import CollectorServer

from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import Raise, ScriptedEngine, tool_call
from roder_api.tools import tool
from roder_api.tracing import rebuild_traces
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_otel import OtelObserver, OtelSettings
from roder_otel import plugin as otel_plugin
from roder_runtime import ReliabilityConfig, Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


@tool
def lookup(q: str) -> str:
    """Look a word up.

    Args:
        q: the word
    """
    return f"found {q}"


def _engine() -> ScriptedEngine:
    failure = ProviderFailure(ProviderFailureKind.NETWORK, "reset")
    return ScriptedEngine(
        models=("gpt-4o",),
        turns=[
            [Usage(TokenUsage(100, 0, 100)), Raise(failure)],
            [tool_call("lookup", {"q": "otel"}), Usage(TokenUsage(120, 10, 130, 20)), Completed()],
            [
                MessageDelta("it is "),
                MessageDelta("tracing"),
                Usage(TokenUsage(150, 5, 155)),
                Completed(),
            ],
        ],
    )


async def _run(base: Path, builder: ExtensionRegistryBuilder) -> tuple[str, list[Any]]:
    builder.inference_engine(_engine()).tool(lookup)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    config = RuntimeConfig(
        default_model="gpt-4o", reliability=ReliabilityConfig(provider_retry_initial_backoff_ms=0)
    )
    async with Runtime(builder.build(), config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "what is otel?") == "it is tracing"
        events = await (await runtime.journal(thread_id)).read_events()
    return thread_id, events


def _in_memory() -> tuple[OtelObserver, InMemorySpanExporter, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    observer = OtelObserver(tracer_provider, MeterProvider(metric_readers=[reader]))
    return observer, exporter, reader


def _by_start(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda s: (s.start_time or 0, s.parent is not None))


async def test_a_turn_is_exported_as_genai_spans_and_metrics(tmp_path: Path) -> None:
    observer, exporter, reader = _in_memory()
    builder = ExtensionRegistryBuilder().observer(observer)
    thread_id, _ = await _run(tmp_path / "threads", builder)
    spans = _by_start(exporter.get_finished_spans())
    root = next(s for s in spans if s.parent is None)
    assert root.name == "invoke_agent roder"
    assert [s.name for s in spans if s.parent is not None] == [
        "chat gpt-4o",
        "chat gpt-4o",
        "execute_tool lookup",
        "chat gpt-4o",
    ]
    assert all(
        s.parent is not None and s.parent.span_id == root.context.span_id
        for s in spans
        if s is not root
    )
    assert len({s.context.trace_id for s in spans}) == 1
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.conversation.id"] == thread_id
    assert attrs["gen_ai.agent.name"] == "roder"
    assert attrs["gen_ai.usage.input_tokens"] == 370
    failed, step, call, answer = [s for s in spans if s is not root]
    assert failed.status.status_code is StatusCode.ERROR
    step_attrs = dict(step.attributes or {})
    assert step_attrs["gen_ai.provider.name"] == "scripted"
    assert step_attrs["gen_ai.request.model"] == "gpt-4o"
    assert step_attrs["gen_ai.usage.cache_read.input_tokens"] == 20
    assert step_attrs["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert dict(call.attributes or {})["gen_ai.tool.call.id"] == "call_lookup"
    assert "gen_ai.output.messages" not in dict(answer.attributes or {})
    assert answer.status.status_code is StatusCode.OK
    data = reader.get_metrics_data()
    assert data is not None
    found = {
        metric.name: metric
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert set(found) == {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}
    usage_points = found["gen_ai.client.token.usage"].data.data_points  # type: ignore[union-attr]
    inputs = sum(
        p.sum for p in usage_points if dict(p.attributes or {})["gen_ai.token.type"] == "input"
    )
    assert inputs == 370
    durations = found["gen_ai.client.operation.duration"].data.data_points  # type: ignore[union-attr]
    assert sum(p.count for p in durations) == 3  # one per model call attempt


async def test_the_observer_emits_the_spans_rebuild_traces_folds(tmp_path: Path) -> None:
    # The observer is built on rebuild_traces: this checks how it hands the spans to the SDK
    # (ids, parents, times, attributes, status). The journal and the live export are
    # compared across processes in test_otel_cli.py.
    observer, exporter, _ = _in_memory()
    thread_id, events = await _run(
        tmp_path / "threads", ExtensionRegistryBuilder().observer(observer)
    )
    (rebuilt,) = rebuild_traces(thread_id, events)
    live = _by_start(exporter.get_finished_spans())
    ids = {s.context.span_id: n for n, s in enumerate(live)}

    def shape(span: ReadableSpan) -> tuple[Any, ...]:
        parent = ids[span.parent.span_id] if span.parent is not None else None
        error = span.status.description if span.status.status_code is StatusCode.ERROR else None
        return (
            span.name,
            parent,
            (span.start_time or 0) // 1_000_000,
            (span.end_time or 0) // 1_000_000,
            dict(span.attributes or {}),
            error,
        )

    rebuilt_ids = {s.span_id: n for n, s in enumerate(rebuilt.spans)}

    def rebuilt_shape(n: int) -> tuple[Any, ...]:
        span = rebuilt.spans[n]
        attributes = {k: tuple(v) if isinstance(v, list) else v for k, v in span.attributes.items()}
        parent = rebuilt_ids[span.parent_span_id] if span.parent_span_id else None
        return (span.name, parent, span.start_ms, span.end_ms, attributes, span.error)

    assert [shape(s) for s in live] == [rebuilt_shape(n) for n in range(len(rebuilt.spans))]


def test_it_is_off_unless_configured() -> None:
    assert not OtelSettings.load({}, {}).enabled
    assert OtelSettings.load({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}).enabled
    assert OtelSettings.load({"endpoint": "http://x:4318"}, {}).enabled
    assert not OtelSettings.load({"endpoint": "http://x"}, {"OTEL_SDK_DISABLED": "true"}).enabled
    registered: list[object] = []
    otel_plugin.register_observers(registered.append, {})
    assert registered == []
    builder = ExtensionRegistryBuilder(settings={"otel": {"endpont": "typo"}})
    info = builder.load_plugin("otel", otel_plugin)
    assert info.error is not None and "unknown key 'endpont'" in info.error


async def test_the_plugin_exports_over_otlp_http(
    tmp_path: Path, collector: CollectorServer
) -> None:
    settings = {"otel": {"endpoint": collector.endpoint, "service_name": "otel-test"}}
    builder = ExtensionRegistryBuilder(settings=settings)
    info = builder.load_plugin("otel", otel_plugin)
    assert info.error is None and info.observers == 1
    thread_id, _ = await _run(tmp_path / "threads", builder)
    # Closing the runtime flushes the batch processor and the metric reader.
    spans = collector.spans()
    names = sorted(span.name for span in spans)
    assert names == sorted(
        ["invoke_agent roder", "chat gpt-4o", "chat gpt-4o", "execute_tool lookup", "chat gpt-4o"]
    )
    resource = collector.traces[0].resource_spans[0].resource
    assert any(
        a.key == "service.name" and a.value.string_value == "otel-test" for a in resource.attributes
    )
    root = next(s for s in spans if s.name == "invoke_agent roder")
    conversation = {a.key: a.value.string_value for a in root.attributes}["gen_ai.conversation.id"]
    assert conversation == thread_id
    metric_names = {
        m.name
        for request in collector.metrics
        for resource_metrics in request.resource_metrics
        for scope in resource_metrics.scope_metrics
        for m in scope.metrics
    }
    assert metric_names == {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}
