"""Rough token estimates of transcripts, and billed usage summed by purpose."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from roder_api.events import Event, JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def estimate_item_tokens(item: TranscriptItem) -> int:
    """Return a rough token count of one transcript item (four characters a token).

    A native boundary counts the JSON of its ``compacted_input`` (what is replayed), or of
    all its data when it has none.
    """
    if isinstance(item, (UserMessage, AssistantMessage, Reasoning)):
        chars = len(item.text) + len(getattr(item, "encrypted_content", None) or "")
    elif isinstance(item, ToolCallRecord):
        chars = len(item.name) + len(item.arguments)
    elif isinstance(item, ToolResultRecord):
        chars = len(item.name) + len(item.result)
    elif isinstance(item, ContextCompaction):
        chars = len(item.summary)
    elif isinstance(item, ProviderMetadata):
        # What is replayed: the ``compacted_input`` when there is one, else the whole JSON.
        replayed = item.data.get("compacted_input") or item.data
        try:
            chars = len(orjson.dumps(replayed, default=str))
        except TypeError:
            chars = len(str(replayed))
    else:  # an item type from a newer version: count its text form
        chars = len(str(item))
    # A few tokens of per-message framing, as providers count them.
    return _tokens(chars) + 4


def estimate_transcript_tokens(
    items: Iterable[TranscriptItem], instructions: str | None = None
) -> int:
    """Return a rough token count of a model request with ``items`` and ``instructions``."""
    total = _tokens(len(instructions)) if instructions else 0
    return total + sum(estimate_item_tokens(item) for item in items)


# --- usage by purpose -------------------------------------------------------------------------


def sum_usage_by_purpose(entries: Iterable[JournalEvent | Event]) -> dict[str, TokenUsage]:
    """Return the billed usage of journal events summed by purpose, sorted by purpose."""
    totals: dict[str, TokenUsage] = {}
    for entry in entries:
        event = entry.event if isinstance(entry, JournalEvent) else entry
        if isinstance(event, UsageUpdated):
            totals[event.purpose] = totals.get(event.purpose, TokenUsage()) + event.usage
    return dict(sorted(totals.items()))


def usage_report(usage: Mapping[str, TokenUsage]) -> dict[str, dict[str, int]]:
    """Return usage by purpose as plain JSON-ready mappings of token counts."""
    return {
        purpose: {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "cached_prompt_tokens": u.cached_prompt_tokens,
            "cache_creation_prompt_tokens": u.cache_creation_prompt_tokens,
            "reasoning_tokens": u.reasoning_tokens,
        }
        for purpose, u in usage.items()
    }
