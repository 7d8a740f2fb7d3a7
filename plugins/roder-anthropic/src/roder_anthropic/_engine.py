"""The ``anthropic`` engine: the Messages API over httpx, streamed, with native compaction.

- ``stream_turn``: ``POST /v1/messages`` with ``stream: true``. With ``compact_threshold``
  set, the request asks for in-turn compaction (``context_management.edits`` with the
  ``compact_20260112`` strategy, beta ``compact-2026-01-12``); the ``compaction`` block
  the server then streams before the reply is yielded as a native compaction boundary
  (``ProviderMetadata``), which the runtime stages with the model step.
- ``compact_turn``: ``POST /v1/messages`` with the top-level ``compaction`` parameter
  (``{"type": "summarize"}``, beta ``compact-2026-09-04``): the answer holds only the
  ``compaction`` block.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import httpx

from roder_anthropic._errors import failure_for_status
from roder_anthropic._replay import anthropic_messages, ends_with_unanswered_call
from roder_anthropic._settings import AnthropicSettings
from roder_anthropic._stream import MessageStreamState, anthropic_usage, message_events
from roder_api.enginekit import check_fits, text_characters
from roder_api.enginekit.httpx_client import HttpxClient
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    ModelDescriptor,
    ProviderFailure,
    ProviderFailureKind,
    ToolSpec,
    Usage,
)
from roder_api.transcript import ProviderMetadata, is_compaction_boundary

IN_TURN_COMPACTION_BETA = "compact-2026-01-12"
"""The beta header that enables ``context_management`` compaction inside a turn."""

STANDALONE_COMPACTION_BETA = "compact-2026-09-04"
"""The beta header that enables the top-level ``compaction`` parameter."""

AUTO_THRESHOLD_FRACTION = 0.8
"""``compact_threshold = "auto"``: compact in-turn at this share of the context window."""

MIN_COMPACT_THRESHOLD = 50_000
"""The smallest trigger the API accepts for in-turn compaction."""

OPAQUE_KEYS = frozenset({"type", "role", "id", "tool_use_id", "signature", "data"})
"""Message keys whose values are not text the model reads (left out of the size check)."""


def anthropic_tool(tool: ToolSpec) -> dict[str, Any]:
    """Return a tool as a Messages API custom tool."""
    schema = dict(tool.parameters) or {"type": "object", "properties": {}}
    entry: dict[str, Any] = {"name": tool.name, "input_schema": schema}
    if tool.description:
        entry["description"] = tool.description
    return entry


class AnthropicEngine(InferenceEngine):
    """The Anthropic Messages API: streamed turns, thinking, tools, native compaction.

    ``transport`` (an ``httpx.AsyncBaseTransport``) replaces the network, for tests.
    """

    id = "anthropic"
    engine_type = "anthropic"
    capabilities = InferenceCapabilities(streaming=True, tool_calls=True, reasoning=True)

    def __init__(
        self,
        settings: AnthropicSettings | None = None,
        *,
        id: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if id is not None:
            self.id = id
        self.settings = settings if settings is not None else AnthropicSettings()
        # What `roder models` and a session report is the model this engine sends.
        self.default_model = self.settings.model
        self._http = HttpxClient.for_settings(
            self.settings,
            user_agent="roder-anthropic/0.1",
            status_failure=failure_for_status,
            where=f"engine {self.id!r} at {self.settings.base_url}",
            transport=transport,
        )

    def __repr__(self) -> str:
        # The key is never an attribute, so nothing here can print it.
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.settings.base_url!r})"

    # --- HTTP ------------------------------------------------------------------------------

    def client(self) -> httpx.AsyncClient:
        """Return the engine's HTTP client, made on first use."""
        return self._http.client()

    async def aclose(self) -> None:
        """Close the HTTP client (a new one is made if the engine is used again)."""
        await self._http.aclose()

    def request_headers(
        self, *, stream: bool, betas: Sequence[str] = ()
    ) -> tuple[dict[str, str], str | None]:
        """Return the headers of one request and the key they carry (for redaction)."""
        key = self.settings.api_key()
        headers = {
            "accept": "text/event-stream" if stream else "application/json",
            "content-type": "application/json",
            "anthropic-version": self.settings.anthropic_version,
        }
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
        if key is not None:
            headers["x-api-key"] = key
        return headers, key

    async def stream_messages(
        self, body: Mapping[str, Any], betas: Sequence[str] = ()
    ) -> AsyncGenerator[InferenceEvent, None]:
        """Yield the inference events of a streamed ``POST /v1/messages``.

        The closing events go out only after the body is settled and the connection
        released (the runtime closes the generator as soon as it sees them). A stream that
        ends before ``message_stop`` raises ``STREAM_INTERRUPTED``; an answer in JSON is
        read as the equivalent whole message.
        """
        headers, key = self.request_headers(stream=True, betas=betas)
        state = MessageStreamState(key)
        stream = self._http.stream_events("v1/messages", body, headers, key, state, "message_stop")
        async with aclosing(stream) as events:
            async for event in events:
                yield event

    async def request_json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        betas: Sequence[str] = (),
    ) -> Any:
        """Return the JSON answer of a non-streamed request; raise ``ProviderFailure``."""
        headers, key = self.request_headers(stream=False, betas=betas)
        return await self._http.request_json(method, path, body, headers, key)

    # --- models ----------------------------------------------------------------------------

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the configured models, or the server's ``GET /v1/models`` list."""
        if self.settings.models:
            return self.settings.models
        data = await self.request_json("GET", "v1/models?limit=1000")
        entries = data.get("data", []) if isinstance(data, dict) else []
        window = self.settings.context_window
        return tuple(
            ModelDescriptor(
                str(entry["id"]),
                context_window=_int(entry.get("max_input_tokens")) or window,
                max_output_tokens=_int(entry.get("max_tokens")),
                display_name=str(entry["display_name"]) if entry.get("display_name") else None,
            )
            for entry in entries
            if isinstance(entry, dict) and entry.get("id")
        )

    def model_for(self, requested: str) -> str:
        """Return the model to call: the request's, or the table's ``model`` for a placeholder.

        The runtime names a model ``<engine id>-default`` when none is configured.
        """
        if requested and requested != f"{self.id}-default":
            return requested
        return self.settings.model

    def max_tokens_for(self, model: str) -> int:
        """Return ``max_tokens``: the model's ``max_output_tokens``, else the table's."""
        descriptor = self.settings.model_descriptor(model)
        if descriptor is not None and descriptor.max_output_tokens:
            return descriptor.max_output_tokens
        return self.settings.max_tokens

    def context_window_for(self, model: str) -> int | None:
        """Return the model's context window, when configured."""
        descriptor = self.settings.model_descriptor(model)
        return (descriptor.context_window if descriptor else None) or self.settings.context_window

    def check_fits(self, body: Mapping[str, Any]) -> None:
        """Raise ``CONTEXT_WINDOW_EXCEEDED`` for a request that cannot fit the model's window.

        Nothing is sent (and the runtime does not retry): with compaction configured the
        server could compact, so then the request always goes out.
        """
        model = str(body["model"])
        window = self.context_window_for(model)
        if not window or self.compact_threshold_for(model) is not None:
            return
        characters = text_characters(body["messages"], OPAQUE_KEYS)
        check_fits(model, window, characters + len(str(body.get("system") or "")))

    def compact_threshold_for(self, model: str) -> int | None:
        """Return the in-turn compaction trigger in tokens (None: no in-turn compaction)."""
        threshold = self.settings.compact_threshold
        if threshold != "auto":
            return threshold if isinstance(threshold, int) else None
        descriptor = self.settings.model_descriptor(model)
        window = (descriptor.context_window if descriptor else None) or (
            self.settings.context_window
        )
        if not window:
            return None
        return max(MIN_COMPACT_THRESHOLD, int(window * AUTO_THRESHOLD_FRACTION))

    # --- requests --------------------------------------------------------------------------

    def base_body(self, request: AgentInferenceRequest) -> dict[str, Any]:
        """Return the body parts every ``POST /v1/messages`` of this request shares."""
        model = self.model_for(request.model)
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": request.output_cap(self.max_tokens_for(model)),
            "messages": anthropic_messages(request.transcript),
        }
        if request.instructions:
            body["system"] = request.instructions
        if self.settings.prompt_cache:
            # One breakpoint on the last cacheable block: the thread's prefix stays cached.
            body["cache_control"] = {"type": "ephemeral"}
        return body

    def request_body(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> tuple[dict[str, Any], list[str]]:
        """Return the streamed turn's body and the beta headers it needs."""
        body = self.base_body(request)
        body["stream"] = True
        betas: list[str] = []
        if request.tools:
            body["tools"] = [anthropic_tool(tool) for tool in request.tools]
        thinking = self.settings.thinking
        if thinking == "adaptive":
            body["thinking"] = {"type": "adaptive"}
        elif isinstance(thinking, int) and (
            request.max_output_tokens is None or thinking < body["max_tokens"]
        ):
            # The API wants budget_tokens below max_tokens: a call capped lower (a summary)
            # goes without extended thinking rather than fail.
            body["thinking"] = {"type": "enabled", "budget_tokens": thinking}
        threshold = self.compact_threshold_for(body["model"])
        if threshold is not None:
            edit: dict[str, Any] = {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": threshold},
            }
            if self.settings.compact_instructions:
                edit["instructions"] = self.settings.compact_instructions
            body["context_management"] = {"edits": [edit]}
            betas.append(IN_TURN_COMPACTION_BETA)
        return body, betas

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the events of one streamed ``POST /v1/messages`` call."""
        body, betas = self.request_body(ctx, request)
        self.check_fits(body)
        async with aclosing(self.stream_messages(body, betas)) as events:
            async for event in events:
                yield event

    async def compact_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield a native compaction of the replay history (the ``compaction`` parameter).

        The boundary is ``ProviderMetadata({"output": [compaction block], "compacted_input":
        [compaction block]})``, then usage and ``Completed``. An answer without a usable
        compaction block yields only usage and ``Completed`` (the runtime discards it).
        """
        if ends_with_unanswered_call(request.transcript):
            raise ProviderFailure(
                ProviderFailureKind.INVALID_REQUEST,
                "cannot compact a history that ends in a tool call without its result; "
                "record the tool's result first",
            )
        body = self.base_body(request)
        compaction: dict[str, Any] = {"type": "summarize"}
        if self.settings.compact_instructions:
            compaction["instructions"] = self.settings.compact_instructions
        body["compaction"] = compaction
        data = await self.request_json(
            "POST", "v1/messages", body, betas=(STANDALONE_COMPACTION_BETA,)
        )
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the compaction answer has no content list"
            )
        response_id = str(data["id"]) if data.get("id") else None
        for event in message_events(data, None):
            # A compaction block with null content is a failed compaction: not a boundary.
            if isinstance(event, ProviderMetadata) and is_compaction_boundary(event):
                block = event.data["output"][0]
                if block.get("content") is None and not block.get("encrypted_content"):
                    continue
                yield event
        usage = anthropic_usage(data.get("usage"))
        if usage is not None:
            yield Usage(usage)
        yield Completed(
            stop_reason=str(data.get("stop_reason") or ""), provider_response_id=response_id
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
