"""The observer: journaled events in, OpenTelemetry spans and metrics out.

Events are kept per thread until the turns they belong to have ended (a turn's end, or a
compaction's, arrives in the batch), then folded by ``roder_api.tracing.rebuild_traces`` and
emitted with their recorded times. A turn still open keeps its events (bounded by
:data:`MAX_BUFFERED_EVENTS` per thread: past it the oldest are dropped, with a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.tracing import SpanData, TurnTrace, rebuild_traces
from roder_otel._settings import OtelSettings

log = logging.getLogger("roder.otel")

MAX_BUFFERED_EVENTS = 100_000
"""Events of unfinished turns kept per thread before the oldest are dropped."""

_ENDS = (TurnComplete, TurnAborted, CompactionCommitted, CompactionDiscarded)
_KINDS = {"CLIENT": SpanKind.CLIENT, "INTERNAL": SpanKind.INTERNAL}
_METRIC_KEYS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model")


class OtelObserver:
    """Emit each ended turn's spans (and GenAI metrics) through the given providers.

    ``tracer_provider`` and ``meter_provider`` are the observer's own (the process's global
    providers are left alone); :meth:`exporting` makes OTLP/HTTP ones from settings, tests
    pass SDK providers with in-memory exporters.
    """

    def __init__(
        self,
        tracer_provider: otel_trace.TracerProvider,
        meter_provider: MeterProvider | None = None,
        *,
        capture_content: bool = False,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.capture_content = capture_content
        self._tracer = tracer_provider.get_tracer("roder_otel")
        self._buffers: dict[str, list[JournalEvent]] = {}
        self._tokens: Histogram | None = None
        self._duration: Histogram | None = None
        if meter_provider is not None:
            meter = meter_provider.get_meter("roder_otel")
            self._tokens = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used",
            )
            self._duration = meter.create_histogram(
                "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
            )

    @classmethod
    def exporting(cls, settings: OtelSettings) -> OtelObserver:
        """Return an observer exporting over OTLP/HTTP (protobuf) as ``settings`` say."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        resource = Resource.create({"service.name": settings.service_name})
        traces: dict[str, Any] = {"headers": dict(settings.headers) or None}
        metrics: dict[str, Any] = {"headers": dict(settings.headers) or None}
        if settings.endpoint is not None:
            traces["endpoint"] = f"{settings.endpoint}/v1/traces"
            metrics["endpoint"] = f"{settings.endpoint}/v1/metrics"
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(**traces)))
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(**metrics),
            export_interval_millis=settings.metric_export_interval_ms,
        )
        meter_provider = SdkMeterProvider(resource=resource, metric_readers=[reader])
        return cls(tracer_provider, meter_provider, capture_content=settings.capture_content)

    async def observe(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        """Keep the batch; emit the turns (and compactions) it ends."""
        buffer = self._buffers.setdefault(thread_id, [])
        buffer.extend(events)
        if len(buffer) > MAX_BUFFERED_EVENTS:
            dropped = len(buffer) - MAX_BUFFERED_EVENTS
            del buffer[:dropped]
            log.warning("roder-otel dropped %d events of an unfinished turn", dropped)
        if not any(isinstance(entry.event, _ENDS) for entry in events):
            return
        traces = rebuild_traces(thread_id, buffer, capture_content=self.capture_content)
        done = [trace for trace in traces if trace.ended]
        for trace in done:
            self.emit(trace)
        if len(done) == len(traces):
            self._buffers.pop(thread_id, None)
        else:
            open_turns = {t.turn_id for t in traces if not t.ended}
            self._buffers[thread_id] = [
                e for e in buffer if getattr(e.event, "turn_id", None) in open_turns
            ]

    def emit(self, trace: TurnTrace) -> None:
        """Emit one turn's spans (root first, children in its context) and its metrics."""
        root = trace.root
        root_span = self._start(root, None)
        context = otel_trace.set_span_in_context(root_span)
        for span in trace.spans[1:]:
            child = self._start(span, context)
            self._end(child, span)
            self._record(span)
        self._end(root_span, root)
        if root.attributes.get("gen_ai.operation.name") == "chat":
            self._record(root)  # a compaction outside a turn is a chat span itself

    def _start(self, span: SpanData, context: Any) -> otel_trace.Span:
        return self._tracer.start_span(
            span.name,
            context=context,
            kind=_KINDS.get(span.kind, SpanKind.INTERNAL),
            attributes=dict(span.attributes),
            start_time=span.start_ms * 1_000_000,
        )

    def _end(self, live: otel_trace.Span, span: SpanData) -> None:
        if span.error is not None:
            live.set_status(Status(StatusCode.ERROR, span.error))
        else:
            live.set_status(Status(StatusCode.OK))
        live.end(end_time=span.end_ms * 1_000_000)

    def _record(self, span: SpanData) -> None:
        if span.attributes.get("gen_ai.operation.name") != "chat":
            return
        if self._tokens is None or self._duration is None:
            return
        keys = {k: span.attributes[k] for k in _METRIC_KEYS if k in span.attributes}
        if "error.type" in span.attributes:
            keys["error.type"] = span.attributes["error.type"]
        self._duration.record(span.duration_s, keys)
        usage = span.usage
        if not usage.is_zero():
            self._tokens.record(usage.prompt_tokens, {**keys, "gen_ai.token.type": "input"})
            self._tokens.record(usage.completion_tokens, {**keys, "gen_ai.token.type": "output"})

    async def aclose(self) -> None:
        """Flush and shut down the providers (runs in the observers' own thread)."""
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if shutdown is not None:
            shutdown()
        if self.meter_provider is not None:
            meter_shutdown = getattr(self.meter_provider, "shutdown", None)
            if meter_shutdown is not None:
                meter_shutdown()
