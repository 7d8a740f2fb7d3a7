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

import anyio
import httpx
import orjson

from roder_anthropic._errors import failure_for_exception, failure_for_status
from roder_anthropic._replay import anthropic_messages, ends_with_unanswered_call
from roder_anthropic._settings import AnthropicSettings
from roder_anthropic._sse import aiter_sse
from roder_anthropic._stream import MessageStreamState, anthropic_usage, message_events
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

MAX_ERROR_BODY = 64 * 1024
"""How much of an error answer's body is kept to explain the failure."""

SETTLE_SECONDS = 1.0
"""How long the end of a body is awaited after the stream's last event."""

CHARS_PER_TOKEN_ESTIMATE = 4
"""Characters per token for the size reported when input is refused as too large."""

CHARS_PER_TOKEN_BOUND = 6
"""Characters per token for the refusal itself: only input that certainly cannot fit is
refused (dense text has fewer characters per token, not more)."""

OPAQUE_KEYS = frozenset({"type", "role", "id", "tool_use_id", "signature", "data"})
"""Message keys whose values are not text the model reads (left out of the size check)."""


def text_characters(value: Any) -> int:
    """Return how many characters of text a request's ``messages`` (or any JSON) hold."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(text_characters(v) for k, v in value.items() if k not in OPAQUE_KEYS)
    if isinstance(value, list):
        return sum(text_characters(v) for v in value)
    return 0


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
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        # The key is never an attribute, so nothing here can print it.
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.settings.base_url!r})"

    # --- HTTP ------------------------------------------------------------------------------

    def client(self) -> httpx.AsyncClient:
        """Return the engine's HTTP client, made on first use."""
        if self._client is None:
            settings = self.settings
            self._client = httpx.AsyncClient(
                base_url=settings.base_url + "/",
                transport=self._transport,
                timeout=httpx.Timeout(
                    settings.timeout, connect=settings.connect_timeout, read=settings.read_timeout
                ),
                headers={"user-agent": "roder-anthropic/0.1"},
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client (a new one is made if the engine is used again)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

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
        client = self.client()
        request = client.build_request(
            "POST", "v1/messages", content=orjson.dumps(body), headers=headers
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise failure_for_exception(error, streaming=False) from None
        final: list[InferenceEvent] = []
        state = MessageStreamState(key)
        try:
            if response.status_code >= 300:
                try:
                    error_body = (await response.aread())[:MAX_ERROR_BODY]
                except httpx.HTTPError:
                    error_body = b""
                raise failure_for_status(response.status_code, response.headers, error_body, key)
            if response.headers.get("content-type", "").startswith("application/json"):
                final = message_events(await self._read_json(response), key)
            else:
                chunks = response.aiter_bytes()
                try:
                    async with aclosing(aiter_sse(chunks)) as events:
                        async for sse in events:
                            produced = state.handle(sse)
                            if state.finished:
                                final = produced
                                break
                            for event in produced:
                                yield event
                except httpx.HTTPError as error:
                    await _settle(chunks, 0)
                    raise failure_for_exception(error, streaming=True) from None
                except BaseException:
                    await _settle(chunks, 0)
                    raise
                await _settle(chunks, SETTLE_SECONDS)
                if not state.finished:
                    raise ProviderFailure(
                        ProviderFailureKind.STREAM_INTERRUPTED,
                        "the response stream ended before message_stop",
                    )
        finally:
            await response.aclose()
        for event in final:
            yield event

    async def _read_json(self, response: httpx.Response) -> Mapping[str, Any]:
        try:
            data = orjson.loads(await response.aread())
        except (httpx.HTTPError, orjson.JSONDecodeError):
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the server answered with JSON that cannot be read"
            ) from None
        if not isinstance(data, dict) or data.get("type") not in (None, "message"):
            raise ProviderFailure(
                ProviderFailureKind.OTHER, "the server answered with JSON that is not a message"
            )
        return data

    async def request_json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        betas: Sequence[str] = (),
    ) -> Any:
        """Return the JSON answer of a non-streamed request; raise ``ProviderFailure``."""
        headers, key = self.request_headers(stream=False, betas=betas)
        try:
            response = await self.client().request(
                method,
                path,
                content=orjson.dumps(body) if body is not None else None,
                headers=headers,
            )
        except httpx.HTTPError as error:
            raise failure_for_exception(error, streaming=False) from None
        if response.status_code >= 300:
            raise failure_for_status(
                response.status_code, response.headers, response.content[:MAX_ERROR_BODY], key
            )
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise ProviderFailure(
                ProviderFailureKind.OTHER,
                f"the server answered {method} {path} with something that is not JSON",
            ) from None

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
        characters = text_characters(body["messages"]) + len(str(body.get("system") or ""))
        if characters // CHARS_PER_TOKEN_BOUND <= window:
            return
        estimate = -(-characters // CHARS_PER_TOKEN_ESTIMATE)
        raise ProviderFailure(
            ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED,
            f"the request is about {estimate} tokens ({characters} characters of text), more "
            f"than the context window of model {model!r} ({window} tokens); nothing was sent. "
            "Shorten the message, or compact or start a new thread",
        )

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
            "max_tokens": self.max_tokens_for(model),
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
        elif isinstance(thinking, int):
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


async def _settle(chunks: AsyncIterator[bytes], seconds: float) -> None:
    """Run httpx's body iterator to its end, for at most ``seconds``.

    Closing only the outer generator leaves httpx's inner ones suspended (trio warns when
    they are collected); reading on lets them finish, at the end of the body or with the
    cancellation of the deadline.
    """
    with anyio.move_on_after(seconds):
        try:
            async for _ in chunks:
                pass
        except httpx.HTTPError:
            pass
