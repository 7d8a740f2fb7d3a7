"""The ``openai`` engine: the Responses API, streamed over server-sent events, and
native compaction through ``POST /responses/compact``.

Source of truth for output items: each item is taken from its ``response.output_item.done``
event (its ciphertext differs from the copy in ``response.completed``, and the two must never
be mixed). ``response.completed``'s ``output`` list only fills in items whose ``done`` event
never came. Text and reasoning summaries are streamed from their delta events; an item's
final text is used only when no delta was streamed for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

from roder_api.enginekit import ServerSentEvent, event_json
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
    ToolSpec,
    Usage,
)
from roder_api.transcript import ProviderMetadata
from roder_openai._http import (
    HttpEngine,
    check_fits,
    is_context_length_error,
    redact,
    text_characters,
)
from roder_openai._replay import (
    PROVIDER,
    ends_with_unanswered_call,
    function_call_metadata,
    reasoning_metadata,
    responses_input,
)

TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "error"}
)
"""The events after which a Responses stream has nothing more to say."""


def responses_usage(usage: Any) -> TokenUsage | None:
    """Return a Responses ``usage`` object as ``TokenUsage`` (None when absent).

    ``input_tokens`` already includes the cached tokens, as ``prompt_tokens`` does, and
    ``output_tokens`` the reasoning tokens (``output_tokens_details.reasoning_tokens``), as
    ``completion_tokens`` does.
    """
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, Mapping) else 0
    output_details = usage.get("output_tokens_details")
    reasoning = (
        output_details.get("reasoning_tokens", 0) if isinstance(output_details, Mapping) else 0
    )
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=int(usage.get("total_tokens") or prompt + completion),
        cached_prompt_tokens=int(cached or 0),
        reasoning_tokens=int(reasoning or 0),
    )


def function_tool(tool: ToolSpec) -> dict[str, Any]:
    """Return a tool as a Responses ``function`` tool.

    ``strict`` is off: strict mode (the Responses default) demands that every property be
    required and no other be allowed, which tools with optional parameters do not meet; the
    runtime checks arguments against the schema itself.
    """
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.parameters) or {"type": "object", "properties": {}},
        "strict": False,
    }


class ResponsesStreamState:
    """Map Responses stream events to inference events, one ``handle`` call at a time."""

    def __init__(self, key: str | None) -> None:
        self._key = key
        self.response_id: str | None = None
        self.finished = False
        self.failure: ProviderFailure | None = None
        self._added: dict[str, dict[str, Any]] = {}  # item id -> the output_item.added item
        self._arguments: dict[str, str] = {}  # item id -> arguments streamed or done
        self._done: set[str] = set()  # item ids whose output_item.done came
        self._streamed_text: set[str] = set()  # items whose text came as deltas
        self._streamed_reasoning: set[str] = set()  # items whose summary came as deltas
        self._last_summary: tuple[str, int] | None = None
        self._reasoning_started = False
        self._called = False

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        """Return the inference events for one server-sent event."""
        if sse.data.strip() == "[DONE]":
            return []  # some proxies end with Chat's sentinel; the terminal event decides
        data = event_json(sse)
        if not isinstance(data, dict):
            return []
        kind = data.get("type") or sse.event
        handler = _HANDLERS.get(str(kind))
        if handler is None:
            return []  # events we do not need (content parts, annotations, built-in tools)
        return handler(self, data)

    def answer(self, data: Any) -> list[InferenceEvent]:
        """Return the events of a whole Response object sent instead of a stream."""
        response = data if isinstance(data, dict) else {}
        if isinstance(response.get("error"), Mapping) and "output" not in response:
            return self._error(response)  # an error body with a 2xx status
        if response.get("object", "response") != "response" or "output" not in response:
            raise ProviderFailure(
                ProviderFailureKind.OTHER,
                "the server answered a streamed request with JSON that is not a response "
                f"(object {response.get('object')!r}); does it speak the Responses API?",
            )
        status = response.get("status")
        if status == "failed":
            return self._failed({"response": response})
        if status == "incomplete":
            return self._incomplete({"response": response})
        return self._completed({"response": response})

    # --- handlers -------------------------------------------------------------------------

    def _created(self, data: dict[str, Any]) -> list[InferenceEvent]:
        response = data.get("response")
        if isinstance(response, Mapping) and response.get("id"):
            self.response_id = str(response["id"])
        return []

    def _item_added(self, data: dict[str, Any]) -> list[InferenceEvent]:
        item = data.get("item")
        if isinstance(item, dict) and item.get("id"):
            self._added[str(item["id"])] = item
        return []

    def _text_delta(self, data: dict[str, Any]) -> list[InferenceEvent]:
        delta = data.get("delta")
        if not isinstance(delta, str) or not delta:
            return []
        self._streamed_text.add(str(data.get("item_id", "")))
        return [MessageDelta(delta)]

    def _reasoning_delta(self, data: dict[str, Any]) -> list[InferenceEvent]:
        delta = data.get("delta")
        if not isinstance(delta, str) or not delta:
            return []
        item_id = str(data.get("item_id", ""))
        self._streamed_reasoning.add(item_id)
        return self._reasoning_text(delta, (item_id, int(data.get("summary_index") or 0)))

    def _reasoning_text(self, text: str, part: tuple[str, int]) -> list[InferenceEvent]:
        # Summary parts (and reasoning items) are separate paragraphs of one reasoning text.
        if self._reasoning_started and part != self._last_summary:
            text = "\n\n" + text
        self._reasoning_started = True
        self._last_summary = part
        return [ReasoningDelta(text)]

    def _arguments_delta(self, data: dict[str, Any]) -> list[InferenceEvent]:
        item_id = str(data.get("item_id", ""))
        delta = data.get("delta")
        if isinstance(delta, str):
            self._arguments[item_id] = self._arguments.get(item_id, "") + delta
        return []

    def _arguments_done(self, data: dict[str, Any]) -> list[InferenceEvent]:
        arguments = data.get("arguments")
        if isinstance(arguments, str):
            self._arguments[str(data.get("item_id", ""))] = arguments
        return []

    def _item_done(self, data: dict[str, Any]) -> list[InferenceEvent]:
        item = data.get("item")
        return self._finish_item(item) if isinstance(item, dict) else []

    def _finish_item(self, item: dict[str, Any]) -> list[InferenceEvent]:
        item_id = str(item.get("id") or "")
        if item_id:
            if item_id in self._done:
                return []
            self._done.add(item_id)
        kind = item.get("type")
        events: list[InferenceEvent] = []
        if kind == "reasoning":
            if item_id not in self._streamed_reasoning:
                for index, part in enumerate(item.get("summary") or ()):
                    text = part.get("text") if isinstance(part, Mapping) else None
                    if isinstance(text, str) and text:
                        events += self._reasoning_text(text, (item_id, index))
            if item.get("encrypted_content"):
                # Kept exactly as received, and replayed exactly (see _replay).
                events.append(reasoning_metadata(item))
        elif kind == "function_call":
            added = self._added.get(item_id, {})
            arguments = item.get("arguments")
            if not isinstance(arguments, str):
                arguments = self._arguments.get(item_id, "")
            call_id = item.get("call_id") or added.get("call_id") or item_id
            name = item.get("name") or added.get("name") or ""
            self._called = True
            # The item as the provider sent it, replayed exactly with its result (_replay).
            kept = {**added, **item, "call_id": call_id, "name": name, "arguments": arguments}
            events.append(function_call_metadata(kept))
            events.append(ToolCallCompleted(str(call_id), str(name), arguments))
        elif kind == "compaction":
            # In-turn compaction (context_management): the boundary, staged by the runtime
            # with this step. The item stands for all the input before it.
            events.append(
                ProviderMetadata(
                    {
                        "provider": PROVIDER,
                        "output": [dict(item)],
                        "compacted_input": [dict(item)],
                        "response_id": self.response_id,
                    }
                )
            )
        elif kind == "message" and item_id not in self._streamed_text:
            for part in item.get("content") or ():
                if not isinstance(part, Mapping):
                    continue
                text = (
                    part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                )
                if isinstance(text, str) and text:
                    events.append(MessageDelta(text))
        return events

    def _completed(self, data: dict[str, Any]) -> list[InferenceEvent]:
        response = data.get("response")
        response = response if isinstance(response, dict) else {}
        self.response_id = str(response.get("id") or self.response_id or "") or None
        events: list[InferenceEvent] = []
        for item in response.get("output") or ():
            # Only items whose output_item.done never came (see the module docstring).
            if isinstance(item, dict) and str(item.get("id") or "") not in self._done:
                events += self._finish_item(item)
        events += self._usage(response)
        events.append(
            Completed(
                stop_reason="tool_calls" if self._called else "stop",
                provider_response_id=self.response_id,
            )
        )
        self.finished = True
        return events

    def _incomplete(self, data: dict[str, Any]) -> list[InferenceEvent]:
        response = data.get("response")
        response = response if isinstance(response, dict) else {}
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        self.finished = True
        return [
            *self._usage(response),
            Failed(f"the response is incomplete ({reason or 'no reason given'})"),
        ]

    def _failed(self, data: dict[str, Any]) -> list[InferenceEvent]:
        response = data.get("response")
        response = response if isinstance(response, dict) else {}
        error = response.get("error")
        self.finished = True
        return [*self._usage(response), *self._failure("the response failed", error)]

    def _error(self, data: dict[str, Any]) -> list[InferenceEvent]:
        error = data.get("error") if isinstance(data.get("error"), Mapping) else data
        self.finished = True
        return self._failure("the server reported an error", error)

    def _failure(self, what: str, error: Any) -> list[InferenceEvent]:
        text = self._error_text(what, error)
        if isinstance(error, Mapping) and is_context_length_error(
            str(error.get("code") or ""),
            str(error.get("type") or ""),
            str(error.get("message") or ""),
        ):
            # Compaction may help: the runtime must see the kind, not a bare Failed.
            self.failure = ProviderFailure(ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED, text)
            return []
        return [Failed(text)]

    def _error_text(self, what: str, error: Any) -> str:
        if not isinstance(error, Mapping):
            return what
        code, message = error.get("code"), error.get("message")
        text = what + (f" ({code})" if code else "") + (f": {message}" if message else "")
        return redact(text, self._key)

    def _usage(self, response: Mapping[str, Any]) -> list[InferenceEvent]:
        usage = responses_usage(response.get("usage"))
        return [Usage(usage)] if usage is not None else []


_HANDLERS = {
    "response.created": ResponsesStreamState._created,
    "response.in_progress": ResponsesStreamState._created,
    "response.queued": ResponsesStreamState._created,
    "response.output_item.added": ResponsesStreamState._item_added,
    "response.output_text.delta": ResponsesStreamState._text_delta,
    "response.refusal.delta": ResponsesStreamState._text_delta,
    "response.reasoning_summary_text.delta": ResponsesStreamState._reasoning_delta,
    "response.reasoning_text.delta": ResponsesStreamState._reasoning_delta,
    "response.function_call_arguments.delta": ResponsesStreamState._arguments_delta,
    "response.function_call_arguments.done": ResponsesStreamState._arguments_done,
    "response.output_item.done": ResponsesStreamState._item_done,
    "response.completed": ResponsesStreamState._completed,
    "response.incomplete": ResponsesStreamState._incomplete,
    "response.failed": ResponsesStreamState._failed,
    "error": ResponsesStreamState._error,
}
"""The Responses stream events this engine acts on; every other event is ignored."""

HANDLED_EVENTS = frozenset(_HANDLERS)
"""The names of the Responses stream events this engine acts on."""

AUTO_THRESHOLD_FRACTION = 0.8
"""``compact_threshold = "auto"``: compact in-turn at this share of the context window."""

OPAQUE_KEYS = frozenset({"encrypted_content", "id", "call_id", "type", "role", "status"})
"""Input keys whose values are not text the model reads (left out of the size check)."""


class OpenAIResponsesEngine(HttpEngine):
    """The OpenAI Responses API: streamed turns and native compaction.

    Requests use ``store: false`` with ``include: ["reasoning.encrypted_content"]``, so the
    whole state lives in the thread: reasoning items are kept as ``ProviderMetadata`` and
    replayed exactly; a native compaction boundary's ``compacted_input`` is sent first.
    """

    id = "openai"
    engine_type = "openai"
    capabilities = InferenceCapabilities(streaming=True, tool_calls=True, reasoning=True)

    def request_body(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> dict[str, Any]:
        """Return the ``POST /responses`` body for one streamed turn."""
        settings = self.settings
        model = self.model_for(request.model)
        body: dict[str, Any] = {
            "model": model,
            "input": responses_input(request.transcript),
            "stream": True,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if request.instructions:
            body["instructions"] = request.instructions
        max_output = request.output_cap(settings.max_output_tokens_for(model))
        if max_output:
            body["max_output_tokens"] = max_output
        temperature = settings.temperature_for(model)
        if temperature is not None:
            body["temperature"] = temperature
        threshold = self.compact_threshold_for(model)
        if threshold:
            body["context_management"] = [{"type": "compaction", "compact_threshold": threshold}]
        if request.tools:
            body["tools"] = [function_tool(tool) for tool in request.tools]
            body["tool_choice"] = "auto"
        reasoning: dict[str, str] = {}
        if settings.reasoning_effort:
            reasoning["effort"] = settings.reasoning_effort
        if settings.reasoning_summary:
            reasoning["summary"] = settings.reasoning_summary
        if reasoning:
            body["reasoning"] = reasoning
        if settings.prompt_cache_key and ctx.thread_id:
            # One cache key per thread keeps its growing prefix on the same cache.
            body["prompt_cache_key"] = ctx.thread_id
        return body

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the events of one streamed ``POST /responses`` call."""
        body = self.request_body(ctx, request)
        window = self.settings.context_window_for(body["model"])
        # With context management the server may compact it to fit; without a window
        # nothing is refused (the input is not walked).
        if window and "context_management" not in body:
            characters = text_characters(body["input"], OPAQUE_KEYS)
            characters += len(request.instructions or "")
            check_fits(body["model"], window, characters)
        stream = self.stream_events("responses", body, ResponsesStreamState, "response.completed")
        async with aclosing(stream) as events:
            async for event in events:
                yield event

    def compact_threshold_for(self, model: str) -> int | None:
        """Return the in-turn compaction threshold in tokens (None: none is asked for).

        ``compact_threshold = "auto"`` is :data:`AUTO_THRESHOLD_FRACTION` of the model's
        context window, when the window is configured.
        """
        threshold = self.settings.compact_threshold
        if threshold != "auto":
            return threshold if isinstance(threshold, int) else None
        window = self.settings.context_window_for(model)
        return int(window * AUTO_THRESHOLD_FRACTION) if window else None

    async def compact_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield a native compaction of the replay history from ``POST /responses/compact``.

        The boundary is ``ProviderMetadata({"output": [compaction item],
        "compacted_input": [what the provider returned, in order]})``, then usage and
        ``Completed``. When the provider returns no compaction item, only usage and
        ``Completed`` follow (the runtime then discards the compaction).
        """
        if ends_with_unanswered_call(request.transcript):
            raise ProviderFailure(
                ProviderFailureKind.INVALID_REQUEST,
                "cannot compact a history that ends in a tool call without its result; "
                "record the tool's result first",
            )
        body: dict[str, Any] = {
            "model": self.model_for(request.model),
            "input": responses_input(request.transcript),
        }
        if request.instructions:
            body["instructions"] = request.instructions
        if self.settings.prompt_cache_key and ctx.thread_id:
            body["prompt_cache_key"] = ctx.thread_id
        data = await self.request_json("POST", "responses/compact", body)
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the compaction answer has no output list"
            )
        output = [entry for entry in data["output"] if isinstance(entry, dict)]
        compactions = [e for e in output if "compaction" in str(e.get("type", ""))]
        response_id = str(data["id"]) if data.get("id") else None
        if compactions:
            yield ProviderMetadata(
                {
                    "provider": PROVIDER,
                    "output": compactions,
                    "compacted_input": output,
                    "response_id": response_id,
                }
            )
        usage = responses_usage(data.get("usage"))
        if usage is not None:
            yield Usage(usage)
        yield Completed(
            stop_reason="compacted" if compactions else "no_compaction",
            provider_response_id=response_id,
        )
