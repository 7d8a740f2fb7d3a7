"""The ``openai-chat`` engine: streamed Chat Completions, the protocol that local servers
(llama.cpp, vLLM, Ollama) and many proxies speak. No native compaction: the runtime's
summarising compaction applies.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson

from roder_api.enginekit import ServerSentEvent
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceCapabilities,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_openai._http import (
    HttpEngine,
    check_fits,
    is_context_length_error,
    redact,
    text_characters,
)
from roder_openai._replay import chat_messages

FAILED_FINISH_REASONS = frozenset({"length", "content_filter"})
"""Finish reasons that mean the reply is not whole: the turn ends with ``Failed``."""


def chat_usage(usage: Any) -> TokenUsage | None:
    """Return a Chat Completions ``usage`` object as ``TokenUsage`` (None when absent).

    ``completion_tokens_details.reasoning_tokens`` (part of ``completion_tokens``) becomes
    ``reasoning_tokens``.
    """
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, Mapping) else 0
    output_details = usage.get("completion_tokens_details")
    reasoning = (
        output_details.get("reasoning_tokens", 0) if isinstance(output_details, Mapping) else 0
    )
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=int(usage.get("total_tokens") or prompt + completion),
        cached_prompt_tokens=int(cached or 0),
        reasoning_tokens=int(reasoning or 0),
    )


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


class ChatStreamState:
    """Assemble a Chat Completions stream: text, tool calls from fragments, usage."""

    def __init__(self, key: str | None) -> None:
        self._key = key
        self.response_id: str | None = None
        self.finish_reason: str | None = None
        self.usage: TokenUsage | None = None
        self.finished = False
        self.failure: ProviderFailure | None = None
        self._calls: dict[int, _PartialCall] = {}

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        """Return the events of one server-sent event (``data: [DONE]`` ends the stream)."""
        data_text = sse.data
        if data_text.strip() == "[DONE]":
            self.finished = True
            return self.finish()
        try:
            chunk = orjson.loads(data_text)
        except orjson.JSONDecodeError:
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the server sent a chunk that is not JSON"
            ) from None
        if not isinstance(chunk, dict):
            return []
        if isinstance(chunk.get("error"), Mapping):
            return self._error(chunk["error"])
        if chunk.get("id") and self.response_id is None:
            self.response_id = str(chunk["id"])
        usage = chat_usage(chunk.get("usage"))
        if usage is not None:
            # Usage is cumulative for the request: the last report wins.
            self.usage = usage
        events: list[InferenceEvent] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                # Local servers stream reasoning as reasoning_content (llama.cpp, vLLM)
                # or reasoning (Ollama, OpenRouter).
                for field in ("reasoning_content", "reasoning"):
                    text = delta.get(field)
                    if isinstance(text, str) and text:
                        events.append(ReasoningDelta(text))
                        break  # a server that sends both sends the same text twice
                for field in ("content", "refusal"):
                    text = delta.get(field)
                    if isinstance(text, str) and text:
                        events.append(MessageDelta(text))
                for fragment in delta.get("tool_calls") or ():
                    if isinstance(fragment, Mapping):
                        self._call_fragment(fragment)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return events

    def _error(self, error: Mapping[str, Any]) -> list[InferenceEvent]:
        self.finished = True
        message = redact(
            f"the server reported an error: {error.get('message') or error}", self._key
        )
        said = (
            str(error.get("code") or ""),
            str(error.get("type") or ""),
            str(error.get("message") or ""),
        )
        if is_context_length_error(*said):
            # Compaction may help: the runtime must see the kind, not a bare Failed.
            self.failure = ProviderFailure(ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED, message)
            return []
        return [Failed(message)]

    def answer(self, data: Any) -> list[InferenceEvent]:
        """Return the events of a whole ``chat.completion`` sent instead of a stream."""
        completion = data if isinstance(data, Mapping) else {}
        if isinstance(completion.get("error"), Mapping):
            return self._error(completion["error"])
        if completion.get("id"):
            self.response_id = str(completion["id"])
        usage = chat_usage(completion.get("usage"))
        if usage is not None:
            self.usage = usage
        events: list[InferenceEvent] = []
        for choice in completion.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            message = choice.get("message")
            if isinstance(message, Mapping):
                for field in ("reasoning_content", "reasoning"):
                    text = message.get(field)
                    if isinstance(text, str) and text:
                        events.append(ReasoningDelta(text))
                        break
                for field in ("content", "refusal"):
                    text = message.get(field)
                    if isinstance(text, str) and text:
                        events.append(MessageDelta(text))
                for index, call in enumerate(message.get("tool_calls") or ()):
                    if isinstance(call, Mapping):
                        self._call_fragment({"index": index, **call})
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        self.finished = True
        return events + self.finish()

    def _call_fragment(self, fragment: Mapping[str, Any]) -> None:
        index = int(fragment.get("index") or 0)
        call = self._calls.setdefault(index, _PartialCall())
        if fragment.get("id"):
            call.id = str(fragment["id"])
        function = fragment.get("function")
        if isinstance(function, Mapping):
            if function.get("name") and not call.name:
                call.name = str(function["name"])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments += arguments

    def finish(self) -> list[InferenceEvent]:
        """Return the events that close a stream that ended with ``[DONE]``."""
        events: list[InferenceEvent] = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if call.name:
                # Some local servers send no id; results pair with calls by id, so make one.
                call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
                events.append(ToolCallCompleted(call_id, call.name, call.arguments))
        if self.usage is not None:
            events.append(Usage(self.usage))
        reason = self.finish_reason
        if reason in FAILED_FINISH_REASONS:
            events.append(Failed(f"the reply is incomplete (finish_reason {reason})"))
        else:
            events.append(Completed(stop_reason=reason, provider_response_id=self.response_id))
        return events


class OpenAIChatEngine(HttpEngine):
    """Chat Completions over SSE with ``stream_options.include_usage``."""

    id = "openai-chat"
    engine_type = "openai-chat"
    capabilities = InferenceCapabilities(streaming=True, tool_calls=True, reasoning=True)

    def request_body(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> dict[str, Any]:
        """Return the ``POST /chat/completions`` body for one streamed turn."""
        model = self.model_for(request.model)
        body: dict[str, Any] = {
            "model": model,
            "messages": chat_messages(request.transcript, request.instructions),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        max_output = request.output_cap(self.settings.max_output_tokens_for(model))
        if max_output:
            body["max_tokens"] = max_output
        temperature = self.settings.temperature_for(model)
        if temperature is not None:
            body["temperature"] = temperature
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": dict(tool.parameters) or {"type": "object", "properties": {}},
                    },
                }
                for tool in request.tools
            ]
        if self.settings.reasoning_effort:
            body["reasoning_effort"] = self.settings.reasoning_effort
        return body

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the events of one streamed ``POST /chat/completions`` call."""
        body = self.request_body(ctx, request)
        window = self.settings.context_window_for(body["model"])
        if window:  # without a window nothing is refused: the history is not walked
            characters = text_characters(body["messages"], frozenset({"role", "type", "id"}))
            check_fits(body["model"], window, characters)
        stream = self.stream_events("chat/completions", body, ChatStreamState, "[DONE]")
        async with aclosing(stream) as events:
            async for event in events:
                yield event
