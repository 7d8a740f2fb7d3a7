"""Replay helpers: the pieces of turning a transcript into a provider's request input that
do not depend on the provider's format.

The rules they serve (see ``docs/writing-an-engine.md``, section 6): replay starts at the
last compaction boundary; a tool call is sent only with its result, and a result only with
its call; a plugin recognises its own ``ProviderMetadata`` by its ``provider`` tag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
    last_compaction_boundary_index,
)

SUMMARY_PREFIX = "Summary of the conversation so far:\n\n"
"""What precedes a local compaction summary when it is replayed as a user message."""


def split_at_boundary(
    transcript: Sequence[TranscriptItem],
) -> tuple[TranscriptItem | None, list[TranscriptItem]]:
    """Return the last compaction boundary (or None) and the items after it."""
    items = list(transcript)
    index = last_compaction_boundary_index(items)
    if index is None:
        return None, items
    return items[index], items[index + 1 :]


def paired_tool_ids(items: Sequence[TranscriptItem]) -> set[str]:
    """Return the ids of tool calls that have both their call and their result."""
    calls = {i.id for i in items if isinstance(i, ToolCallRecord)}
    results = {i.id for i in items if isinstance(i, ToolResultRecord)}
    return calls & results


def kept_entry(item: object, provider: str, field: str) -> Mapping[str, Any] | None:
    """Return what a plugin kept in ``item`` for exact replay, or None.

    That is ``item.data[field]`` for a ``ProviderMetadata`` (not a compaction boundary)
    tagged ``{"provider": provider}`` whose ``field`` is a mapping with a string ``type``
    (a Responses item, a Messages content block, ...).
    """
    if not isinstance(item, ProviderMetadata) or is_compaction_boundary(item):
        return None
    data = item.data
    if not isinstance(data, Mapping) or data.get("provider") != provider:
        return None
    kept = data.get(field)
    return kept if isinstance(kept, Mapping) and isinstance(kept.get("type"), str) else None


def content_text(content: Any) -> str:
    """Return the text of a message's ``content``: a string, or the ``text`` of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def ends_with_unanswered_call(transcript: Sequence[TranscriptItem]) -> bool:
    """Return True when the history's last tool call has no result after it.

    Native compaction refuses such a history before sending anything.
    """
    _, items = split_at_boundary(transcript)
    answered: set[str] = set()
    for item in reversed(items):
        if isinstance(item, ToolResultRecord):
            answered.add(item.id)
        elif isinstance(item, ToolCallRecord):
            return item.id not in answered
        elif isinstance(item, (UserMessage, AssistantMessage)):
            return False
    return False
