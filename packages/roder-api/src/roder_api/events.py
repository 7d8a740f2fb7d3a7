"""Session events: what a session emits and a thread store journals, in order."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from roder_api._record import Record, from_dict, register
from roder_api.inference import TokenUsage
from roder_api.transcript import TranscriptItem, is_compaction_boundary


class ContentPhase(str, enum.Enum):
    """Which part of an answer a text delta belongs to."""

    REASONING = "reasoning"
    FINAL_ANSWER = "final_answer"


class _Word(str, enum.Enum):
    """A ``str`` enum that prints as its value (the word journaled on disk)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class UsagePurpose(_Word):
    """What billed tokens were spent on (``UsageUpdated.purpose``)."""

    TURN = "turn"
    COMPACTION = "compaction"
    DISCARDED_COMPACTION = "discarded_compaction"


class CompactionMode(_Word):
    """How a compaction makes its boundary: the engine's own, or a model-written summary."""

    NATIVE = "native"
    SUMMARY = "summary"


class DiscardReason(_Word):
    """Why a candidate compaction boundary was discarded (``CompactionDiscarded.reason``)."""

    DISCONNECTED = "disconnected"
    FAILED = "failed"
    CONFLICTING_BOUNDARY = "conflicting_boundary"
    TOOL_CALL = "tool_call"
    NO_BOUNDARY = "no_boundary"
    NOT_COMPLETED = "not_completed"
    PREEMPTED = "preempted"
    CONFLICT = "conflict"
    INTERRUPTED = "interrupted"
    TOO_LARGE = "too_large"


class AbortReason(_Word):
    """Why a turn ended early (``TurnAborted.reason``)."""

    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CLOSED = "closed"
    RUNTIME_CLOSED = "runtime_closed"
    PROCESS_EXITED = "process_exited"
    TIMEOUT = "timeout"
    BUDGET_EXCEEDED = "budget_exceeded"


def _usage(value: Any) -> TokenUsage:
    return value if isinstance(value, TokenUsage) else from_dict(value)


@register("turn_started")
@dataclass(frozen=True, slots=True)
class TurnStarted(Record):
    """A turn began.

    ``metadata``: what the submitter attached to the turn's input (``UserInput.metadata``),
    never interpreted by the runtime. It is journaled once, on the turn's first event: here,
    unless the input waited and its ``InputAccepted`` carries it (None when nothing was, as
    in journals written before it was recorded).
    """

    turn_id: str
    metadata: Mapping[str, Any] | None = None


@register("model_step_started")
@dataclass(frozen=True, slots=True)
class ModelStepStarted(Record):
    """A model call (step) of a turn began.

    ``model`` and ``provider`` (the engine's id) name what is called; journals written
    before they were recorded read back with None.
    """

    turn_id: str
    model_step_id: str
    model: str | None = None
    provider: str | None = None


@register("assistant_content_delta", phase=ContentPhase)
@dataclass(frozen=True, slots=True)
class AssistantContentDelta(Record):
    """Streamed text of a model step, in the reasoning or the final-answer phase."""

    turn_id: str
    model_step_id: str
    phase: ContentPhase
    delta: str


@register("item_completed", item=from_dict)
@dataclass(frozen=True, slots=True)
class ItemCompleted(Record):
    """A transcript item is complete and part of the thread's history."""

    turn_id: str
    item: TranscriptItem


@register("usage_updated", usage=_usage)
@dataclass(frozen=True, slots=True)
class UsageUpdated(Record):
    """Tokens billed; ``purpose`` is a :class:`UsagePurpose` (``turn``, ``compaction`` or
    ``discarded_compaction``), kept as a plain string when read back.

    ``model`` and ``provider`` (the engine's id) say what billed them, for pricing; None in
    journals written before they were recorded (their cost is then unknown).
    ``response_id`` and ``finish_reason`` are the provider's id of the response and why it
    stopped (its ``Completed``), on the usage a completed model call reported last; None on
    other usage, when the engine did not say, and in journals written before they were
    recorded.
    """

    turn_id: str | None
    usage: TokenUsage
    purpose: str = UsagePurpose.TURN
    model: str | None = None
    provider: str | None = None
    response_id: str | None = None
    finish_reason: str | None = None


@register("compaction_started")
@dataclass(frozen=True, slots=True)
class CompactionStarted(Record):
    """A compaction began; ``mode`` is a :class:`CompactionMode` (``native`` or ``summary``)."""

    turn_id: str | None = None
    mode: str = CompactionMode.NATIVE


@register("compaction_committed")
@dataclass(frozen=True, slots=True)
class CompactionCommitted(Record):
    """A compaction boundary was committed (journaled with its ``ItemCompleted``)."""

    turn_id: str | None = None
    mode: str = CompactionMode.NATIVE


@register("compaction_discarded")
@dataclass(frozen=True, slots=True)
class CompactionDiscarded(Record):
    """A candidate boundary was discarded; the history is unchanged.

    ``reason`` is a :class:`DiscardReason`: ``disconnected``, ``failed``,
    ``conflicting_boundary``, ``tool_call``, ``no_boundary``, ``not_completed``,
    ``preempted``, ``conflict`` (the journal moved on meanwhile), ``interrupted`` or
    ``too_large`` (a summary over the output cap it was asked for).
    """

    reason: str
    turn_id: str | None = None


@register("tool_call_started")
@dataclass(frozen=True, slots=True)
class ToolCallStarted(Record):
    """Tool call ``call_id`` is about to run: journaled right before the tool is called.

    A call with this event and no result was running when the process exited.
    """

    turn_id: str
    call_id: str


@register("tool_approval_requested")
@dataclass(frozen=True, slots=True)
class ToolApprovalRequested(Record):
    """Tool call ``call_id`` waits for the user's ``ApproveToolCall``."""

    turn_id: str
    call_id: str
    name: str
    arguments: str


@register("tool_approval_decided")
@dataclass(frozen=True, slots=True)
class ToolApprovalDecided(Record):
    """The user approved or denied tool call ``call_id`` (``reason`` is theirs, if any)."""

    turn_id: str
    call_id: str
    approved: bool
    reason: str | None = None


@register("warning")
@dataclass(frozen=True, slots=True)
class WarningEvent(Record):
    """Something went wrong but the work goes on."""

    message: str
    turn_id: str | None = None


@register("error")
@dataclass(frozen=True, slots=True)
class ErrorEvent(Record):
    """Something failed; the message says what and what to do."""

    message: str
    turn_id: str | None = None


@register("turn_complete")
@dataclass(frozen=True, slots=True)
class TurnComplete(Record):
    """A turn ended normally."""

    turn_id: str
    last_assistant_message: str | None = None


@register("turn_aborted")
@dataclass(frozen=True, slots=True)
class TurnAborted(Record):
    """A turn ended early; ``reason`` is an :class:`AbortReason` (``interrupted``,
    ``failed``, ``closed``, ``runtime_closed``, ``process_exited``, ``timeout``,
    ``budget_exceeded``)."""

    turn_id: str
    reason: str


@register("input_accepted")
@dataclass(frozen=True, slots=True)
class InputAccepted(Record):
    """User input a session accepted before it could become part of a turn's transcript.

    Journaled before ``Session.submit`` returns when the input cannot be journaled as a
    ``UserMessage`` at once: a turn is running (a queued ``UserInput``, or a ``Steer`` —
    ``steer`` True), or the turn compacts first. ``turn_id`` is the turn the input starts or
    steers. It is answered once a ``UserMessage`` with its text is journaled in that turn; a
    session that opens on a thread with unanswered input runs it (or, for a turn that died,
    journals it into that turn before closing it). ``metadata`` as for ``TurnStarted``.
    """

    turn_id: str
    text: str
    steer: bool = False
    metadata: Mapping[str, Any] | None = None


Event: TypeAlias = (
    TurnStarted
    | ModelStepStarted
    | AssistantContentDelta
    | ItemCompleted
    | UsageUpdated
    | CompactionStarted
    | CompactionCommitted
    | CompactionDiscarded
    | ToolCallStarted
    | ToolApprovalRequested
    | ToolApprovalDecided
    | WarningEvent
    | ErrorEvent
    | TurnComplete
    | TurnAborted
    | InputAccepted
)
"""Any session event."""

EVENT_TYPES: tuple[type[Record], ...] = (
    TurnStarted,
    ModelStepStarted,
    AssistantContentDelta,
    ItemCompleted,
    UsageUpdated,
    CompactionStarted,
    CompactionCommitted,
    CompactionDiscarded,
    ToolCallStarted,
    ToolApprovalRequested,
    ToolApprovalDecided,
    WarningEvent,
    ErrorEvent,
    TurnComplete,
    TurnAborted,
    InputAccepted,
)
"""The classes of :data:`Event`, for ``isinstance`` checks."""


@register("journal_event", event=from_dict)
@dataclass(frozen=True, slots=True)
class JournalEvent(Record):
    """An event as persisted: its sequence number (from 1) and when it was recorded."""

    sequence: int
    recorded_at_ms: int
    event: Event


def is_boundary_event(event: object) -> bool:
    """Return True when ``event`` completes a compaction boundary item."""
    return isinstance(event, ItemCompleted) and is_compaction_boundary(event.item)


__all__ = [
    "AbortReason",
    "AssistantContentDelta",
    "CompactionCommitted",
    "CompactionDiscarded",
    "CompactionMode",
    "CompactionStarted",
    "ContentPhase",
    "DiscardReason",
    "EVENT_TYPES",
    "ErrorEvent",
    "Event",
    "InputAccepted",
    "ItemCompleted",
    "JournalEvent",
    "ModelStepStarted",
    "ToolApprovalDecided",
    "ToolApprovalRequested",
    "ToolCallStarted",
    "TurnAborted",
    "TurnComplete",
    "TurnStarted",
    "UsagePurpose",
    "UsageUpdated",
    "WarningEvent",
    "is_boundary_event",
]
