"""Session events: what a session emits and a thread store journals, in order."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeAlias

from roder_api._record import Record, from_dict, register
from roder_api.inference import TokenUsage
from roder_api.transcript import TranscriptItem, is_compaction_boundary


class ContentPhase(str, enum.Enum):
    """Which part of an answer a text delta belongs to."""

    REASONING = "reasoning"
    FINAL_ANSWER = "final_answer"


def _usage(value: Any) -> TokenUsage:
    return value if isinstance(value, TokenUsage) else from_dict(value)


@register("turn_started")
@dataclass(frozen=True, slots=True)
class TurnStarted(Record):
    """A turn began."""

    turn_id: str


@register("model_step_started")
@dataclass(frozen=True, slots=True)
class ModelStepStarted(Record):
    """A model call (step) of a turn began."""

    turn_id: str
    model_step_id: str


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
    """Tokens billed; ``purpose`` is ``turn``, ``compaction`` or ``discarded_compaction``."""

    turn_id: str | None
    usage: TokenUsage
    purpose: str = "turn"


@register("compaction_started")
@dataclass(frozen=True, slots=True)
class CompactionStarted(Record):
    """A compaction began; ``mode`` is ``native`` or ``summary``."""

    turn_id: str | None = None
    mode: str = "native"


@register("compaction_committed")
@dataclass(frozen=True, slots=True)
class CompactionCommitted(Record):
    """A compaction boundary was committed (journaled with its ``ItemCompleted``)."""

    turn_id: str | None = None
    mode: str = "native"


@register("compaction_discarded")
@dataclass(frozen=True, slots=True)
class CompactionDiscarded(Record):
    """A candidate boundary was discarded; the history is unchanged.

    ``reason`` is one of ``disconnected``, ``failed``, ``conflicting_boundary``,
    ``tool_call``, ``no_boundary``, ``not_completed``, ``preempted``.
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
    """A turn ended early (``interrupted``, ``failed``, ``closed``, ``process_exited``,
    ``timeout``)."""

    turn_id: str
    reason: str


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
    "AssistantContentDelta",
    "CompactionCommitted",
    "CompactionDiscarded",
    "CompactionStarted",
    "ContentPhase",
    "EVENT_TYPES",
    "ErrorEvent",
    "Event",
    "ItemCompleted",
    "JournalEvent",
    "ModelStepStarted",
    "ToolApprovalDecided",
    "ToolApprovalRequested",
    "ToolCallStarted",
    "TurnAborted",
    "TurnComplete",
    "TurnStarted",
    "UsageUpdated",
    "WarningEvent",
    "is_boundary_event",
]
