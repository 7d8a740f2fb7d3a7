"""Transcript items: what a thread's history is made of, and the compaction boundary rules."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from roder_api._record import Record, register


@register("user_message")
@dataclass(frozen=True, slots=True)
class UserMessage(Record):
    """A message the user wrote."""

    text: str


@register("assistant_message")
@dataclass(frozen=True, slots=True)
class AssistantMessage(Record):
    """A message the model wrote; ``interrupted`` marks partial text of an aborted turn."""

    text: str
    interrupted: bool = False


@register("reasoning")
@dataclass(frozen=True, slots=True)
class Reasoning(Record):
    """The model's reasoning (summary) text, with the provider's opaque ciphertext if any."""

    text: str
    encrypted_content: str | None = None


@register("tool_call")
@dataclass(frozen=True, slots=True)
class ToolCallRecord(Record):
    """A tool call the model made; ``arguments`` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str


@register("tool_result")
@dataclass(frozen=True, slots=True)
class ToolResultRecord(Record):
    """The result of a tool call, paired with it by ``id``."""

    id: str
    name: str
    result: str
    display_payload: Any = None
    is_error: bool = False


@register("context_compaction")
@dataclass(frozen=True, slots=True)
class ContextCompaction(Record):
    """A local summary boundary: replay starts with this summary instead of what came before."""

    summary: str


@register("provider_metadata")
@dataclass(frozen=True, slots=True)
class ProviderMetadata(Record):
    """Opaque provider JSON kept in the transcript and replayed exactly.

    When ``data["output"]`` holds an item whose ``type`` contains ``compaction`` this is a
    native compaction boundary, and ``data["compacted_input"]`` (if present) is what the
    provider wants replayed in place of everything before it.
    """

    data: Mapping[str, Any]


TranscriptItem: TypeAlias = (
    UserMessage
    | AssistantMessage
    | Reasoning
    | ToolCallRecord
    | ToolResultRecord
    | ContextCompaction
    | ProviderMetadata
)
"""Any item of a thread's transcript."""

TRANSCRIPT_ITEM_TYPES: tuple[type[Record], ...] = (
    UserMessage,
    AssistantMessage,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    ContextCompaction,
    ProviderMetadata,
)
"""The classes of :data:`TranscriptItem`, for ``isinstance`` checks."""


def native_compaction_items(item: ProviderMetadata) -> list[Mapping[str, Any]]:
    """Return the native compaction items in a provider metadata item's ``output`` list."""
    output = item.data.get("output") if isinstance(item.data, Mapping) else None
    if not isinstance(output, Sequence) or isinstance(output, (str, bytes)):
        return []
    found: list[Mapping[str, Any]] = []
    for entry in output:
        if isinstance(entry, Mapping):
            kind = entry.get("type")
            if isinstance(kind, str) and "compaction" in kind:
                found.append(entry)
    return found


def is_compaction_boundary(item: object) -> bool:
    """Return True when ``item`` is a compaction boundary (local summary or native)."""
    if isinstance(item, ContextCompaction):
        return True
    if isinstance(item, ProviderMetadata):
        return bool(native_compaction_items(item))
    return False


def last_compaction_boundary_index(items: Sequence[object]) -> int | None:
    """Return the index of the last compaction boundary in ``items``, or None."""
    for index in range(len(items) - 1, -1, -1):
        if is_compaction_boundary(items[index]):
            return index
    return None


def trim_to_last_compaction_boundary(items: Iterable[TranscriptItem]) -> list[TranscriptItem]:
    """Return the items from the last compaction boundary on (all items when there is none)."""
    listed = list(items)
    index = last_compaction_boundary_index(listed)
    return listed if index is None else listed[index:]


__all__ = [
    "AssistantMessage",
    "ContextCompaction",
    "ProviderMetadata",
    "Reasoning",
    "TRANSCRIPT_ITEM_TYPES",
    "ToolCallRecord",
    "ToolResultRecord",
    "TranscriptItem",
    "UserMessage",
    "is_compaction_boundary",
    "last_compaction_boundary_index",
    "native_compaction_items",
    "trim_to_last_compaction_boundary",
]
