"""Map Messages API stream events (and whole messages) to inference events.

``message_start`` → the response id and the usage known so far; ``content_block_start`` /
``content_block_delta`` / ``content_block_stop`` → text (``MessageDelta``), thinking
(``ReasoningDelta``, then the block kept as ``ProviderMetadata``), tool use (streamed
``input_json_delta`` assembled into ``ToolCallCompleted``) and a ``compaction`` block (a
native compaction boundary); ``message_delta`` → the stop reason and the final usage;
``message_stop`` → ``Usage`` and ``Completed`` (or ``Failed`` for a cut-off reply);
``ping`` → nothing; ``error`` → ``ProviderFailure`` of the error's kind.

Usage is reported in parts that add up: what ``message_start`` says at once (so a stream
that breaks later is still billed for its input), the rest at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from roder_anthropic._errors import error_of, failure_for_error
from roder_anthropic._replay import block_metadata, compaction_boundary
from roder_api.enginekit import ServerSentEvent, event_json
from roder_api.inference import (
    Completed,
    Failed,
    InferenceEvent,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)

INCOMPLETE_STOP_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})
"""Stop reasons that mean the reply was cut off: the step ends with ``Failed``."""

HANDLED_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
"""The stream events this engine acts on (``ping`` by ignoring it)."""


def _tokens(usage: Mapping[str, Any]) -> TokenUsage:
    fresh = int(usage.get("input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    created = int(usage.get("cache_creation_input_tokens") or 0)
    output = int(usage.get("output_tokens") or 0)
    prompt = fresh + read + created
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=output,
        total_tokens=prompt + output,
        cached_prompt_tokens=read,
        cache_creation_prompt_tokens=created,
    )


def anthropic_usage(usage: Any) -> TokenUsage | None:
    """Return an Anthropic ``usage`` object as ``TokenUsage`` (None when absent).

    Anthropic's ``input_tokens`` leaves out the cached tokens; ``prompt_tokens`` includes
    them (``cache_read_input_tokens`` and ``cache_creation_input_tokens`` are subsets of
    it). When the answer lists ``iterations`` (a compaction ran), the billed usage is
    their sum: the top-level fields leave the compaction out.
    """
    if not isinstance(usage, Mapping):
        return None
    iterations = usage.get("iterations")
    if isinstance(iterations, list) and iterations:
        total = TokenUsage()
        for entry in iterations:
            if isinstance(entry, Mapping):
                total = total + _tokens(entry)
        return total
    return _tokens(usage)


def _minus(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(
        prompt_tokens=max(0, a.prompt_tokens - b.prompt_tokens),
        completion_tokens=max(0, a.completion_tokens - b.completion_tokens),
        total_tokens=max(0, a.total_tokens - b.total_tokens),
        cached_prompt_tokens=max(0, a.cached_prompt_tokens - b.cached_prompt_tokens),
        cache_creation_prompt_tokens=max(
            0, a.cache_creation_prompt_tokens - b.cache_creation_prompt_tokens
        ),
    )


@dataclass
class _Block:
    data: dict[str, Any]
    json: str = ""
    texts: list[str] = field(default_factory=list)


class MessageStreamState:
    """Map one Messages stream to inference events, one ``handle`` call at a time."""

    def __init__(self, key: str | None) -> None:
        self._key = key
        self.response_id: str | None = None
        self.stop_reason: str | None = None
        self.finished = False
        self.failure: ProviderFailure | None = None  # errors are raised from handle()
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, Any] = {}
        self._billed = TokenUsage()
        self._reasoning_started = False
        self._called = False

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        """Return the inference events for one server-sent event."""
        data = event_json(sse)
        if not isinstance(data, dict):
            return []
        kind = str(data.get("type") or sse.event)
        if kind == "message_start":
            return self._message_start(data)
        if kind == "content_block_start":
            return self._block_start(data)
        if kind == "content_block_delta":
            return self._block_delta(data)
        if kind == "content_block_stop":
            return self._block_stop(data)
        if kind == "message_delta":
            return self._message_delta(data)
        if kind == "message_stop":
            return self.finish()
        if kind == "error":
            error_kind, message = error_of(data)
            raise failure_for_error(error_kind, message, self._key)
        return []  # ping, and events newer than this engine

    def answer(self, data: Any) -> list[InferenceEvent]:
        """Return the events of a whole message sent as JSON to a streamed request; finish."""
        if not isinstance(data, dict) or data.get("type") not in (None, "message"):
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the server answered with JSON that is not a message"
            )
        self.finished = True
        return message_events(data, self._key)

    def _message_start(self, data: dict[str, Any]) -> list[InferenceEvent]:
        message = data.get("message")
        message = message if isinstance(message, Mapping) else {}
        if message.get("id"):
            self.response_id = str(message["id"])
        usage = message.get("usage")
        if isinstance(usage, Mapping):
            self._usage.update(usage)
        return self._bill()

    def _bill(self) -> list[InferenceEvent]:
        current = anthropic_usage(self._usage) if self._usage else None
        if current is None:
            return []
        extra = _minus(current, self._billed)
        if extra.is_zero():
            return []
        self._billed = self._billed + extra
        return [Usage(extra)]

    def _block_start(self, data: dict[str, Any]) -> list[InferenceEvent]:
        block = data.get("content_block")
        if not isinstance(block, dict):
            return []
        index = int(data.get("index") or 0)
        self._blocks[index] = _Block(dict(block))
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            return [MessageDelta(str(block["text"]))]
        if kind == "thinking" and block.get("thinking"):
            return self._reasoning(str(block["thinking"]), index)
        return []

    def _reasoning(self, text: str, index: int) -> list[InferenceEvent]:
        block = self._blocks[index]
        if self._reasoning_started and not block.texts:
            text = "\n\n" + text  # each thinking block is a paragraph of one reasoning text
        self._reasoning_started = True
        block.texts.append(text)
        return [ReasoningDelta(text)]

    def _block_delta(self, data: dict[str, Any]) -> list[InferenceEvent]:
        index = int(data.get("index") or 0)
        block = self._blocks.setdefault(index, _Block({"type": "text", "text": ""}))
        delta = data.get("delta")
        if not isinstance(delta, Mapping):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if isinstance(text, str) and text:
                block.data["text"] = str(block.data.get("text") or "") + text
                return [MessageDelta(text)]
        elif kind == "thinking_delta":
            text = delta.get("thinking")
            if isinstance(text, str) and text:
                block.data["thinking"] = str(block.data.get("thinking") or "") + text
                return self._reasoning(text, index)
        elif kind == "signature_delta":
            signature = delta.get("signature")
            if isinstance(signature, str):
                block.data["signature"] = str(block.data.get("signature") or "") + signature
        elif kind == "input_json_delta":
            partial = delta.get("partial_json")
            if isinstance(partial, str):
                block.json += partial
        elif kind == "compaction_delta":
            # The whole summary arrives in one delta; keep every field exactly as sent.
            for name, value in delta.items():
                if name != "type":
                    block.data[name] = value
        return []

    def _block_stop(self, data: dict[str, Any]) -> list[InferenceEvent]:
        block = self._blocks.get(int(data.get("index") or 0))
        if block is None:
            return []
        return self._finish_block(block)

    def _finish_block(self, block: _Block) -> list[InferenceEvent]:
        kind = block.data.get("type")
        if kind in ("thinking", "redacted_thinking"):
            return [block_metadata(block.data)]
        if kind == "tool_use":
            self._called = True
            arguments = block.json
            if not arguments.strip():
                given = block.data.get("input")
                arguments = orjson.dumps(given if isinstance(given, dict) else {}).decode()
            call_id = str(block.data.get("id") or "")
            return [ToolCallCompleted(call_id, str(block.data.get("name") or ""), arguments)]
        if kind == "compaction":
            return [compaction_boundary(block.data, self.response_id)]
        return []

    def _message_delta(self, data: dict[str, Any]) -> list[InferenceEvent]:
        delta = data.get("delta")
        if isinstance(delta, Mapping) and delta.get("stop_reason"):
            self.stop_reason = str(delta["stop_reason"])
        usage = data.get("usage")
        if isinstance(usage, Mapping):
            # message_delta's counts are cumulative; fields it leaves out stay as they were.
            self._usage.update({k: v for k, v in usage.items() if v is not None})
        return []

    def finish(self) -> list[InferenceEvent]:
        """Return the events that close the stream (at ``message_stop``)."""
        self.finished = True
        events = self._bill()
        reason = self.stop_reason
        if reason in INCOMPLETE_STOP_REASONS:
            events.append(Failed(f"the reply is incomplete (stop_reason {reason})"))
        else:
            events.append(Completed(stop_reason=reason, provider_response_id=self.response_id))
        return events


def message_events(message: Mapping[str, Any], key: str | None) -> list[InferenceEvent]:
    """Return the events of a whole (non-streamed) message, as its stream would give them."""
    state = MessageStreamState(key)
    usage = message.get("usage")
    start = {k: v for k, v in message.items() if k not in ("content", "usage")}
    events = state._message_start({"message": start})
    if isinstance(usage, Mapping):
        state._usage.update(usage)
    for index, block in enumerate(message.get("content") or ()):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            events += state._block_start({"index": index, "content_block": block})
        elif kind == "thinking":
            events += state._block_start({"index": index, "content_block": block})
            events += state._block_stop({"index": index})
        elif kind == "tool_use":
            events += state._finish_block(_Block(dict(block)))
        else:
            events += state._finish_block(_Block(dict(block)))
    if message.get("stop_reason"):
        state.stop_reason = str(message["stop_reason"])
    return events + state.finish()
