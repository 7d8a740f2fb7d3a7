"""Turning a replay transcript into request input: Responses items or Chat messages.

Rules both formats keep:

- Replay starts at the last compaction boundary. A native boundary's ``compacted_input``
  (what the provider returned: the kept user messages, then the compaction item) goes
  first, verbatim and in order; a local summary (``ContextCompaction``) goes first as a
  user message. Then every item after the boundary.
- A tool call is replayed only with its result, and a result only with its call: the APIs
  reject either alone (an interrupted turn can leave one behind). A Responses
  ``function_call`` item kept as ``ProviderMetadata`` (its ``id``, ``status``, ...) is
  replayed exactly, in the place of its ``ToolCallRecord``.
- ``Reasoning`` items are display text; what the provider needs is the reasoning item it
  returned, kept as ``ProviderMetadata`` (Responses only).
- A reasoning item must be followed by the item it belongs to (the next tool call or
  assistant message of the same response). A reasoning item that cannot be replayed (no
  ``encrypted_content``, or nothing after it) is dropped, and then the assistant message it
  belonged to is not replayed either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    "assistant_message",
    "boundary_input",
    "chat_messages",
    "ends_with_unanswered_call",
    "function_call_metadata",
    "kept_item",
    "paired_tool_ids",
    "reasoning_metadata",
    "replayable_reasoning",
    "responses_input",
    "split_at_boundary",
    "user_message",
]

PROVIDER = "openai"
"""``ProviderMetadata.data["provider"]`` of the items this plugin keeps."""


def reasoning_metadata(item: Mapping[str, Any]) -> ProviderMetadata:
    """Return the transcript item that keeps a Responses reasoning item for replay."""
    return ProviderMetadata({"provider": PROVIDER, "item": dict(item)})


def function_call_metadata(item: Mapping[str, Any]) -> ProviderMetadata:
    """Return the transcript item that keeps a Responses function_call item for replay."""
    return ProviderMetadata({"provider": PROVIDER, "item": dict(item)})


def kept_item(item: object) -> Mapping[str, Any] | None:
    """Return the Responses item kept in ``item`` by this plugin, or None."""
    return kept_entry(item, PROVIDER, "item")


def boundary_input(boundary: TranscriptItem | None) -> list[dict[str, Any]]:
    """Return the Responses input items that stand for a compaction boundary."""
    if boundary is None:
        return []
    if isinstance(boundary, ContextCompaction):
        return [user_message(SUMMARY_PREFIX + boundary.summary)]
    if isinstance(boundary, ProviderMetadata):
        compacted = boundary.data.get("compacted_input")
        if isinstance(compacted, Sequence) and not isinstance(compacted, (str, bytes)):
            return [dict(entry) for entry in compacted if isinstance(entry, Mapping)]
        return [dict(entry) for entry in native_compaction_items(boundary)]
    return []


def user_message(text: str) -> dict[str, Any]:
    """Return a Responses user message item."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant_message(text: str) -> dict[str, Any]:
    """Return a Responses assistant message item."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def replayable_reasoning(item: Mapping[str, Any]) -> bool:
    """Return True for a reasoning item that can be sent back under ``store: false``."""
    return item.get("type") == "reasoning" and bool(item.get("encrypted_content"))


def responses_input(transcript: Sequence[TranscriptItem]) -> list[dict[str, Any]]:
    """Return the Responses API ``input`` items for a replay transcript (see module doc)."""
    boundary, items = split_at_boundary(transcript)
    out = boundary_input(boundary)
    paired = paired_tool_ids(items)
    kept_calls: dict[str, dict[str, Any]] = {}
    for item in items:
        kept = kept_item(item)
        if kept is not None and kept.get("type") == "function_call":
            kept_calls[str(kept.get("call_id"))] = dict(kept)
    pending: list[dict[str, Any]] = []  # reasoning waiting for the item it belongs to
    dropped_reasoning = False  # the next assistant message lost its reasoning item

    def settle_pending() -> None:
        # Reasoning with nothing after it in its response cannot be replayed.
        pending.clear()

    for item in items:
        kept = kept_item(item)
        if kept is not None:
            if kept.get("type") == "function_call":
                continue  # replayed in the place of its ToolCallRecord, with its result
            if kept.get("type") == "reasoning":
                if replayable_reasoning(kept):
                    pending.append(dict(kept))
                else:
                    dropped_reasoning = True
            else:
                out.append(dict(kept))
        elif isinstance(item, UserMessage):
            settle_pending()
            dropped_reasoning = False
            out.append(user_message(item.text))
        elif isinstance(item, AssistantMessage):
            if dropped_reasoning and not pending:
                dropped_reasoning = False
                continue
            out.extend(pending)
            pending.clear()
            dropped_reasoning = False
            if item.text:
                out.append(assistant_message(item.text))
        elif isinstance(item, ToolCallRecord):
            if item.id not in paired:
                settle_pending()
                continue
            out.extend(pending)
            pending.clear()
            dropped_reasoning = False
            out.append(
                kept_calls.get(item.id)
                or {
                    "type": "function_call",
                    "call_id": item.id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        elif isinstance(item, ToolResultRecord):
            if item.id not in paired:
                continue
            settle_pending()
            out.append({"type": "function_call_output", "call_id": item.id, "output": item.result})
        elif isinstance(item, (Reasoning, ContextCompaction, ProviderMetadata)):
            continue  # display text, or another engine's metadata
    return out


# --- Chat Completions ----------------------------------------------------------------------


def chat_messages(
    transcript: Sequence[TranscriptItem], instructions: str | None
) -> list[dict[str, Any]]:
    """Return Chat Completions ``messages`` for a replay transcript.

    A native boundary's readable messages are kept; its opaque compaction item cannot be
    read by a Chat Completions server and is left out.
    """
    boundary, items = split_at_boundary(transcript)
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for entry in boundary_input(boundary):
        role = entry.get("role")
        if entry.get("type", "message") == "message" and role in ("user", "assistant"):
            text = content_text(entry.get("content"))
            if text:
                messages.append({"role": role, "content": text})
    paired = paired_tool_ids(items)
    open_assistant: dict[str, Any] | None = None
    for item in items:
        if isinstance(item, (AssistantMessage, ToolCallRecord)):
            if isinstance(item, ToolCallRecord) and item.id not in paired:
                continue
            if open_assistant is None:
                open_assistant = {"role": "assistant", "content": None}
                messages.append(open_assistant)
            if isinstance(item, AssistantMessage):
                if item.text:
                    open_assistant["content"] = (open_assistant["content"] or "") + item.text
            else:
                open_assistant.setdefault("tool_calls", []).append(
                    {
                        "id": item.id,
                        "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments},
                    }
                )
            continue
        if isinstance(item, UserMessage):
            open_assistant = None
            messages.append({"role": "user", "content": item.text})
        elif isinstance(item, ToolResultRecord) and item.id in paired:
            open_assistant = None
            messages.append({"role": "tool", "tool_call_id": item.id, "content": item.result})
    # An assistant turn with neither text nor tool calls says nothing.
    return [
        m for m in messages if m["role"] != "assistant" or m.get("content") or m.get("tool_calls")
    ]
