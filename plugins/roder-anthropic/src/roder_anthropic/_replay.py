"""Turning a replay transcript into Messages API ``messages``.

Rules:

- Replay starts at the last compaction boundary. An Anthropic boundary's
  ``compacted_input`` (the ``compaction`` block, exactly as the API returned it) opens the
  first assistant message; the step's own reply, if any, follows in the same message, as
  the API sent it. Another provider's boundary contributes its readable messages, a local
  summary (``ContextCompaction``) a user message.
- Consecutive assistant-side items (thinking, text, tool use) form one assistant message;
  tool results and user text form one user message.
- A tool call is replayed only with its result, and a result only with its call.
- Thinking blocks (``thinking`` with its ``signature``, ``redacted_thinking``) are replayed
  byte for byte, and only in front of the text or tool use of the same reply: a thinking
  block with nothing after it is dropped.
- ``Reasoning`` items are display text and are never sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from roder_api.enginekit import (
    SUMMARY_PREFIX,
    content_text,
    ends_with_unanswered_call,
    kept_entry,
    paired_tool_ids,
    split_at_boundary,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    native_compaction_items,
)

__all__ = [
    "PROVIDER",
    "SUMMARY_PREFIX",
    "THINKING_TYPES",
    "anthropic_messages",
    "block_metadata",
    "compaction_boundary",
    "ends_with_unanswered_call",
    "kept_block",
    "tool_input",
]

PROVIDER = "anthropic"
"""``ProviderMetadata.data["provider"]`` of the items this plugin keeps."""

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
"""Content blocks that are kept verbatim and replayed in front of their reply."""


def block_metadata(block: Mapping[str, Any]) -> ProviderMetadata:
    """Return the transcript item that keeps a content block for exact replay."""
    return ProviderMetadata({"provider": PROVIDER, "block": dict(block)})


def compaction_boundary(
    block: Mapping[str, Any], response_id: str | None = None
) -> ProviderMetadata:
    """Return the native compaction boundary of a ``compaction`` block."""
    return ProviderMetadata(
        {
            "provider": PROVIDER,
            "output": [dict(block)],
            "compacted_input": [dict(block)],
            "response_id": response_id,
        }
    )


def kept_block(item: object) -> Mapping[str, Any] | None:
    """Return the content block kept in ``item`` by this plugin, or None."""
    return kept_entry(item, PROVIDER, "block")


def tool_input(arguments: str) -> dict[str, Any]:
    """Return a tool call's JSON arguments as the ``input`` object the API wants."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}  # kept, so the model can see what it sent
    return value if isinstance(value, dict) else {"value": value}


class _Builder:
    """Collects content blocks into alternating user and assistant messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.pending_thinking: list[dict[str, Any]] = []

    def add(self, role: str, block: dict[str, Any]) -> None:
        if self.messages and self.messages[-1]["role"] == role:
            self.messages[-1]["content"].append(block)
        else:
            self.messages.append({"role": role, "content": [block]})

    def reply(self, block: dict[str, Any]) -> None:
        for thinking in self.pending_thinking:
            self.add("assistant", thinking)
        self.pending_thinking.clear()
        self.add("assistant", block)

    def user(self, block: dict[str, Any]) -> None:
        self.pending_thinking.clear()  # thinking with nothing after it cannot be replayed
        self.add("user", block)


def _boundary(builder: _Builder, boundary: TranscriptItem | None) -> None:
    if boundary is None:
        return
    if isinstance(boundary, ContextCompaction):
        builder.user({"type": "text", "text": SUMMARY_PREFIX + boundary.summary})
        return
    if not isinstance(boundary, ProviderMetadata):
        return
    data = boundary.data
    compacted = data.get("compacted_input") if isinstance(data, Mapping) else None
    if data.get("provider") == PROVIDER:
        blocks = compacted if isinstance(compacted, Sequence) else native_compaction_items(boundary)
        for block in blocks:
            if isinstance(block, Mapping):
                builder.add("assistant", dict(block))
        return
    # Another provider's native boundary: only its readable messages mean anything here.
    for entry in compacted if isinstance(compacted, Sequence) else ():
        if not isinstance(entry, Mapping) or entry.get("role") not in ("user", "assistant"):
            continue
        text = content_text(entry.get("content"))
        if text:
            role = str(entry["role"])
            (builder.user if role == "user" else builder.reply)({"type": "text", "text": text})


def anthropic_messages(transcript: Sequence[TranscriptItem]) -> list[dict[str, Any]]:
    """Return the ``messages`` of a replay transcript (see the module docstring)."""
    boundary, items = split_at_boundary(transcript)
    builder = _Builder()
    _boundary(builder, boundary)
    paired = paired_tool_ids(items)
    for item in items:
        block = kept_block(item)
        if block is not None:
            if block.get("type") in THINKING_TYPES:
                builder.pending_thinking.append(dict(block))
            continue
        if isinstance(item, UserMessage):
            if item.text:
                builder.user({"type": "text", "text": item.text})
        elif isinstance(item, AssistantMessage):
            if item.text.strip():
                builder.reply({"type": "text", "text": item.text})
        elif isinstance(item, ToolCallRecord):
            if item.id in paired:
                builder.reply(
                    {
                        "type": "tool_use",
                        "id": item.id,
                        "name": item.name,
                        "input": tool_input(item.arguments),
                    }
                )
        elif isinstance(item, ToolResultRecord):
            if item.id in paired:
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": item.id,
                    "content": item.result,
                }
                if item.is_error:
                    result["is_error"] = True
                builder.user(result)
        elif isinstance(item, (Reasoning, ContextCompaction, ProviderMetadata)):
            continue  # display text, or another engine's metadata
    _results_first(builder.messages)
    return builder.messages


def _results_first(messages: list[dict[str, Any]]) -> None:
    """Put a user message's ``tool_result`` blocks before its text, as the API requires."""
    for message in messages:
        if message["role"] == "user":
            content = message["content"]
            content.sort(key=lambda block: 0 if block.get("type") == "tool_result" else 1)
