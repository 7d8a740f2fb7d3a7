"""Traces of turns, rebuilt from journaled events in the OpenTelemetry GenAI conventions.

A pure function of the journal (no OpenTelemetry dependency): :func:`rebuild_traces` turns
a thread's events into one :class:`TurnTrace` per turn — the span tree that
``plugins/roder-otel`` exports live and ``roder threads trace`` writes as OTLP JSON
(:func:`otlp_json`), so both are the same by construction. Times come from the events'
``recorded_at_ms``.

The tree of a turn::

    invoke_agent roder                 the turn (gen_ai.conversation.id = thread id)
      chat {model}                     a model call attempt (a retried attempt ends in error)
      execute_tool {name}              a tool call, from ToolCallStarted to its result
      chat {model}                     compaction (roder.purpose = compaction)

A turn that never ended in the journal (its process was killed) and a turn that ended
with ``TurnAborted`` end with an error status, and so do the spans still open in them.
Content (the user's input, the model's output, tool arguments and results) is included
only when ``capture_content`` is True.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson

from roder_api.events import (
    AssistantContentDelta,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ContentPhase,
    ErrorEvent,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    ToolCallStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsagePurpose,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import TokenUsage
from roder_api.transcript import AssistantMessage, ToolCallRecord, ToolResultRecord, UserMessage

AttributeValue: TypeAlias = str | int | float | bool | list[str]
"""A span attribute's value (OpenTelemetry's primitive types and string arrays)."""

AGENT_NAME = "roder"
"""``gen_ai.agent.name`` and the name in ``invoke_agent roder``."""

NOT_ENDED = "the turn did not end: its process exited while it ran"
"""The error status of a turn the journal never closed, and of its open spans."""


@dataclass
class SpanData:
    """One span: name, ids (hex), times in epoch milliseconds, attributes, status.

    ``error`` is the status description of a span that ended in error (None: OK). ``kind``
    is ``INTERNAL`` (the turn, tools) or ``CLIENT`` (model calls).
    """

    name: str
    span_id: str
    parent_span_id: str | None
    start_ms: int
    end_ms: int
    kind: str = "INTERNAL"
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    error: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    first_chunk_ms: int | None = None
    output: str = ""

    @property
    def duration_s(self) -> float:
        """Return the span's duration in seconds."""
        return max(0, self.end_ms - self.start_ms) / 1000


@dataclass
class TurnTrace:
    """The spans of one turn (the root first), with the trace id (32 hex digits)."""

    thread_id: str
    turn_id: str
    trace_id: str
    spans: list[SpanData] = field(default_factory=list)
    ended: bool = False

    @property
    def root(self) -> SpanData:
        """Return the ``invoke_agent`` span."""
        return self.spans[0]


def _hex(n: int, *parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[: 2 * n]


def _usage_attributes(usage: TokenUsage) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    if usage.cached_prompt_tokens:
        found["gen_ai.usage.cache_read.input_tokens"] = usage.cached_prompt_tokens
    if usage.cache_creation_prompt_tokens:
        found["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_creation_prompt_tokens
    if usage.reasoning_tokens:
        found["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return found


def _response_attributes(span: SpanData, event: UsageUpdated) -> None:
    """Put the provider's response id and finish reason (journaled with the usage) on ``span``."""
    if event.response_id:
        span.attributes["gen_ai.response.id"] = event.response_id
    if event.finish_reason:
        # The provider's own word wins over what the step's items suggest (see _item).
        span.attributes["gen_ai.response.finish_reasons"] = [event.finish_reason]


def _messages(role: str, text: str) -> str:
    return orjson.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}]).decode()


class _Builder:
    """Folds events into turn traces (one pass, in journal order)."""

    def __init__(self, thread_id: str, capture_content: bool) -> None:
        self.thread_id = thread_id
        self.capture = capture_content
        self.traces: dict[str, TurnTrace] = {}
        self.order: list[TurnTrace] = []
        self.model_span: dict[str, SpanData] = {}  # turn id -> the open chat span
        self.compaction: dict[str, SpanData] = {}  # turn id ("" outside turns) -> span
        self.tools: dict[tuple[str, str], SpanData] = {}  # (turn, call id) -> open span
        self.tool_names: dict[tuple[str, str], tuple[str, str]] = {}
        self.last_ms: dict[str, int] = {}
        self.error_text: dict[str, str] = {}

    def trace(self, turn_id: str, at_ms: int) -> TurnTrace:
        found = self.traces.get(turn_id)
        if found is None:
            trace_id = _hex(16, self.thread_id, turn_id)
            root = SpanData(
                f"invoke_agent {AGENT_NAME}",
                _hex(8, self.thread_id, turn_id, "turn"),
                None,
                at_ms,
                at_ms,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": AGENT_NAME,
                    "gen_ai.conversation.id": self.thread_id,
                    "roder.turn_id": turn_id,
                },
            )
            found = TurnTrace(self.thread_id, turn_id, trace_id, [root])
            self.traces[turn_id] = found
            self.order.append(found)
        return found

    def child(self, trace: TurnTrace, name: str, key: str, at_ms: int, kind: str) -> SpanData:
        span = SpanData(
            name,
            _hex(8, self.thread_id, trace.turn_id, key),
            trace.root.span_id,
            at_ms,
            at_ms,
            kind=kind,
            attributes={"gen_ai.conversation.id": self.thread_id},
        )
        trace.spans.append(span)
        return span

    def close_model(self, turn_id: str, error: str | None = None) -> None:
        span = self.model_span.pop(turn_id, None)
        if span is None:
            return
        span.error = error
        if error is not None:
            span.attributes["error.type"] = "provider_failure"
        self._finish_model(span)

    def _finish_model(self, span: SpanData) -> None:
        span.attributes.update(_usage_attributes(span.usage))
        if span.first_chunk_ms is not None:
            ttfc = max(0, span.first_chunk_ms - span.start_ms) / 1000
            span.attributes["gen_ai.response.time_to_first_chunk"] = ttfc
        if self.capture and span.output:
            span.attributes["gen_ai.output.messages"] = _messages("assistant", span.output)

    def touch(self, turn_id: str | None, at_ms: int) -> None:
        if turn_id is None or turn_id not in self.traces:
            return
        self.last_ms[turn_id] = at_ms
        trace = self.traces[turn_id]
        trace.root.end_ms = at_ms
        span = self.model_span.get(turn_id)
        if span is not None:
            span.end_ms = at_ms

    def feed(self, entry: JournalEvent) -> None:
        event, at = entry.event, entry.recorded_at_ms
        if isinstance(event, TurnStarted):
            self.trace(event.turn_id, at)
            return
        turn_id = getattr(event, "turn_id", None)
        if (
            turn_id is not None
            and turn_id not in self.traces
            and turn_id not in self.compaction
            and not isinstance(event, CompactionStarted)
        ):
            return  # events of a turn whose start is not in this journal slice
        if isinstance(event, ModelStepStarted):
            self.close_model(event.turn_id, "the model call was retried")
            trace = self.traces[event.turn_id]
            name = f"chat {event.model}" if event.model else "chat"
            span = self.child(trace, name, event.model_step_id, at, "CLIENT")
            span.attributes.update(
                {"gen_ai.operation.name": "chat", "roder.model_step_id": event.model_step_id}
            )
            if event.provider:
                span.attributes["gen_ai.provider.name"] = event.provider
            if event.model:
                span.attributes["gen_ai.request.model"] = event.model
                trace.root.attributes.setdefault("gen_ai.request.model", event.model)
            if event.provider:
                trace.root.attributes.setdefault("gen_ai.provider.name", event.provider)
            self.model_span[event.turn_id] = span
        elif isinstance(event, AssistantContentDelta):
            streaming = self.model_span.get(event.turn_id)
            if streaming is not None:
                if streaming.first_chunk_ms is None:
                    streaming.first_chunk_ms = at
                if event.phase == ContentPhase.FINAL_ANSWER:
                    streaming.output += event.delta
        elif isinstance(event, UsageUpdated):
            self._usage(event, at)
        elif isinstance(event, WarningEvent) and event.turn_id is not None:
            if event.message.startswith("model call attempt"):
                self.touch(event.turn_id, at)
                self.close_model(event.turn_id, event.message)
                return
        elif isinstance(event, ItemCompleted):
            self._item(event, at)
        elif isinstance(event, ToolCallStarted):
            self.close_model(event.turn_id)
            trace = self.traces[event.turn_id]
            name, arguments = self.tool_names.get((event.turn_id, event.call_id), ("?", ""))
            span = self.child(
                trace, f"execute_tool {name}", f"tool:{event.call_id}", at, "INTERNAL"
            )
            span.attributes.update(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": event.call_id,
                }
            )
            if self.capture:
                span.attributes["gen_ai.tool.call.arguments"] = arguments
            self.tools[(event.turn_id, event.call_id)] = span
        elif isinstance(event, CompactionStarted):
            self._compaction_started(event, at)
        elif isinstance(event, (CompactionCommitted, CompactionDiscarded)):
            compaction = self.compaction.pop(event.turn_id or "", None)
            if compaction is not None:
                compaction.end_ms = at
                self._finish_model(compaction)
                if isinstance(event, CompactionDiscarded):
                    compaction.attributes["roder.compaction.discarded"] = event.reason
        elif isinstance(event, ErrorEvent) and event.turn_id is not None:
            self.error_text[event.turn_id] = event.message
        elif isinstance(event, (TurnComplete, TurnAborted)):
            self.touch(event.turn_id, at)
            self._end_turn(event, at)
            return
        self.touch(turn_id, at)

    def _usage(self, event: UsageUpdated, at: int) -> None:
        key = event.turn_id or ""
        if event.purpose == UsagePurpose.TURN and event.turn_id is not None:
            span = self.model_span.get(event.turn_id)
            if span is not None:
                span.usage = span.usage + event.usage
                _response_attributes(span, event)
        else:
            span = self.compaction.get(key)
            if span is not None:
                span.usage = span.usage + event.usage
                _response_attributes(span, event)
                if event.model and "gen_ai.request.model" not in span.attributes:
                    span.name = f"chat {event.model}"
                    span.attributes["gen_ai.request.model"] = event.model
                if event.provider:
                    span.attributes["gen_ai.provider.name"] = event.provider
        if event.turn_id is not None and event.turn_id in self.traces:
            root = self.traces[event.turn_id].root
            root.usage = root.usage + event.usage

    def _item(self, event: ItemCompleted, at: int) -> None:
        item, turn_id = event.item, event.turn_id
        trace = self.traces.get(turn_id)
        if trace is None:
            return  # the boundary of a compaction outside a turn (its own trace)
        if isinstance(item, UserMessage) and self.capture:
            trace.root.attributes.setdefault("gen_ai.input.messages", _messages("user", item.text))
        span = self.model_span.get(turn_id)
        if isinstance(item, ToolCallRecord):
            self.tool_names[(turn_id, item.id)] = (item.name, item.arguments)
            if span is not None:
                span.attributes.setdefault("gen_ai.response.finish_reasons", ["tool_calls"])
        elif isinstance(item, AssistantMessage) and span is not None:
            span.attributes.setdefault("gen_ai.response.finish_reasons", ["stop"])
            if not span.output:
                span.output = item.text
        elif isinstance(item, ToolResultRecord):
            tool = self.tools.pop((turn_id, item.id), None)
            if tool is not None:
                tool.end_ms = at
                if item.is_error:
                    tool.error = item.result[:200]
                    tool.attributes["error.type"] = "tool_error"
                if self.capture:
                    tool.attributes["gen_ai.tool.call.result"] = item.result

    def _compaction_started(self, event: CompactionStarted, at: int) -> None:
        key = event.turn_id or ""
        if event.turn_id is not None and event.turn_id in self.traces:
            trace = self.traces[event.turn_id]
        else:
            # A compaction outside a turn (roder compact): a trace of its own.
            trace = self.trace(f"compaction:{event.turn_id or ''}:{at}", at)
            trace.root.name = "chat"
            trace.root.attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": self.thread_id,
                "roder.purpose": "compaction",
            }
            trace.ended = True
            self.compaction[key] = trace.root
            return
        span = self.child(trace, "chat", f"compaction:{at}", at, "CLIENT")
        span.attributes.update(
            {
                "gen_ai.operation.name": "chat",
                "roder.purpose": "compaction",
                "roder.compaction.mode": str(event.mode),
            }
        )
        self.compaction[key] = span

    def _end_turn(self, event: TurnComplete | TurnAborted, at: int) -> None:
        trace = self.traces[event.turn_id]
        trace.ended = True
        root = trace.root
        root.end_ms = at
        if isinstance(event, TurnAborted):
            message = self.error_text.get(event.turn_id)
            root.error = f"{event.reason}: {message}" if message else str(event.reason)
            root.attributes["error.type"] = str(event.reason)
            self._close_open(event.turn_id, root.error, at)
        else:
            self._close_open(event.turn_id, None, at)
        root.attributes.update(_usage_attributes(root.usage))

    def _close_open(self, turn_id: str, error: str | None, at: int) -> None:
        self.close_model(turn_id, error)
        for key in [k for k in self.tools if k[0] == turn_id]:
            span = self.tools.pop(key)
            span.end_ms, span.error = at, error
        compaction = self.compaction.pop(turn_id, None)
        if compaction is not None:
            compaction.end_ms, compaction.error = at, error
            self._finish_model(compaction)

    def finish(self) -> list[TurnTrace]:
        for trace in self.order:
            if not trace.ended:
                # The journal ends inside this turn: its process died (or it still runs).
                at = self.last_ms.get(trace.turn_id, trace.root.start_ms)
                trace.root.end_ms = at
                trace.root.error = NOT_ENDED
                trace.root.attributes["error.type"] = "process_exited"
                self._close_open(trace.turn_id, NOT_ENDED, at)
                trace.root.attributes.update(_usage_attributes(trace.root.usage))
        return self.order


def rebuild_traces(
    thread_id: str, events: Iterable[JournalEvent], *, capture_content: bool = False
) -> list[TurnTrace]:
    """Return the trace of every turn in ``events`` (a thread's journal, in order)."""
    builder = _Builder(thread_id, capture_content)
    for entry in events:
        builder.feed(entry)
    return builder.finish()


# --- OTLP JSON --------------------------------------------------------------------------------


def _any_value(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [{"stringValue": str(v)} for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attributes: Mapping[str, AttributeValue]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


_KINDS = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3}


def otlp_json(traces: Iterable[TurnTrace], *, service_name: str = "roder") -> dict[str, Any]:
    """Return ``traces`` as an OTLP/JSON ``ExportTraceServiceRequest`` (one resource)."""
    spans = []
    for trace in traces:
        for span in trace.spans:
            record: dict[str, Any] = {
                "traceId": trace.trace_id,
                "spanId": span.span_id,
                "name": span.name,
                "kind": _KINDS.get(span.kind, 1),
                "startTimeUnixNano": str(span.start_ms * 1_000_000),
                "endTimeUnixNano": str(span.end_ms * 1_000_000),
                "attributes": _attributes(span.attributes),
                "status": (
                    {"code": 2, "message": span.error} if span.error is not None else {"code": 1}
                ),
            }
            if span.parent_span_id is not None:
                record["parentSpanId"] = span.parent_span_id
            spans.append(record)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": service_name})},
                "scopeSpans": [{"scope": {"name": "roder"}, "spans": spans}],
            }
        ]
    }


def span_tree(trace: TurnTrace) -> str:
    """Return a turn's spans as an indented text tree (names, durations, status)."""
    lines = []
    for span in trace.spans:
        indent = "" if span.parent_span_id is None else "  "
        status = f"  ERROR: {span.error}" if span.error is not None else ""
        lines.append(f"{indent}{span.name}  {span.end_ms - span.start_ms} ms{status}")
    return "\n".join(lines)


CAPTURE_CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard variable that opts in to prompt and output content in spans."""


def capture_content(environ: Mapping[str, str]) -> bool:
    """Return True when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` opts in.

    ``true`` (any case) or ``1`` opt in; newer values that name where content goes
    (``span_only``, ``span_and_event``) opt in too; anything else (``false``,
    ``no_content``, unset) keeps content out.
    """
    value = environ.get(CAPTURE_CONTENT_VARIABLE, "").strip().lower()
    return value in ("true", "1", "span_only", "span_and_event")


__all__ = [
    "AGENT_NAME",
    "AttributeValue",
    "CAPTURE_CONTENT_VARIABLE",
    "NOT_ENDED",
    "SpanData",
    "TurnTrace",
    "capture_content",
    "otlp_json",
    "rebuild_traces",
    "span_tree",
]
