"""HTTP plumbing shared by both engines: the client, headers, and errors mapped to failures.

The mechanisms are the engine kit's (``roder_api.enginekit``); what is OpenAI's here is the
error body's shape, the ``retry-after-ms`` header and the context-length error marks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx
import orjson

from roder_api.enginekit import (
    CHARS_PER_TOKEN_BOUND,
    CHARS_PER_TOKEN_ESTIMATE,
    MAX_ERROR_BODY,
    ServerSentEvent,
    check_fits,
    error_failure,
    parse_retry_after,
    parse_retry_after_ms,
    redact,
    text_characters,
)
from roder_api.enginekit.httpx_client import (
    SETTLE_SECONDS,
    HttpxClient,
    StreamState,
    failure_for_exception,
)
from roder_api.inference import (
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    ModelDescriptor,
    ProviderFailure,
    ProviderFailureKind,
)
from roder_openai._settings import EngineSettings

__all__ = [
    "CHARS_PER_TOKEN_BOUND",
    "CHARS_PER_TOKEN_ESTIMATE",
    "CONTEXT_ERROR_MARKS",
    "MAX_ERROR_BODY",
    "SETTLE_SECONDS",
    "HttpEngine",
    "StreamState",
    "check_fits",
    "error_details",
    "failure_for_exception",
    "failure_for_status",
    "is_context_length_error",
    "redact",
    "retry_after_seconds",
    "text_characters",
]


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Return the server's retry hint in seconds (``retry-after-ms``, then ``Retry-After``)."""
    millis = parse_retry_after_ms(headers.get("retry-after-ms"))
    if millis is not None:
        return millis
    return parse_retry_after(headers.get("retry-after"), now)


def error_details(body: bytes) -> tuple[str | None, str | None, str]:
    """Return ``(code, type, message)`` from an OpenAI-style error body (or plain text)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None, body.decode("utf-8", errors="replace").strip()[:500]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, str):
        return None, None, error
    if not isinstance(error, dict):
        return None, None, str(error)[:500]
    code = error.get("code")
    kind = error.get("type")
    message = error.get("message") or error.get("detail") or ""
    return (
        str(code) if code is not None else None,
        str(kind) if kind is not None else None,
        str(message),
    )


def failure_for_status(
    status: int, headers: httpx.Headers, body: bytes, key: str | None
) -> ProviderFailure:
    """Return the failure for a non-2xx response (3xx and other 4xx: invalid request).

    The message is redacted of the key and of anything shaped like one.
    """
    code, kind, message = error_details(body)
    return error_failure(
        status,
        message,
        key,
        code=code,
        context_exceeded=is_context_length_error(code, kind, message),
        retry_after=retry_after_seconds(headers),
    )


CONTEXT_ERROR_MARKS = (
    "context_length_exceeded",  # OpenAI's code
    "exceed_context_size",  # llama.cpp's error type
    "exceeds the context window",  # OpenAI's message
    "exceeds the available context size",  # llama.cpp
    "maximum context length",  # vLLM and OpenAI-compatible proxies
)
"""What an error's code, type or message holds when the input is over the window."""


def is_context_length_error(code: str | None, kind: str | None, message: str) -> bool:
    """Return True when an error says the input is over the model's context window."""
    said = f"{code or ''} {kind or ''} {message}".lower()
    return any(mark in said for mark in CONTEXT_ERROR_MARKS)


class HttpEngine(InferenceEngine):
    """The HTTP half of an OpenAI-style engine: settings, a lazily made client, requests.

    ``transport`` (an ``httpx.AsyncBaseTransport``) replaces the network, for tests.
    """

    def __init__(
        self,
        settings: EngineSettings | None = None,
        *,
        id: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if id is not None:
            self.id = id
        self.settings = settings if settings is not None else EngineSettings()
        self.default_model = self.settings.model
        self._http = HttpxClient.for_settings(
            self.settings,
            user_agent="roder-openai/0.1",
            status_failure=failure_for_status,
            where=self.where,
            transport=transport,
        )

    @property
    def where(self) -> str:
        """Return which engine talks to which server (``engine 'ollama' at http://...``)."""
        return f"engine {self.id!r} at {self.settings.base_url}"

    def __repr__(self) -> str:
        # The key is never an attribute, so nothing here can print it.
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.settings.base_url!r})"

    def client(self) -> httpx.AsyncClient:
        """Return the engine's HTTP client, made on first use."""
        return self._http.client()

    async def aclose(self) -> None:
        """Close the HTTP client (a new one is made if the engine is used again)."""
        await self._http.aclose()

    def request_headers(self, *, stream: bool) -> tuple[dict[str, str], str | None]:
        """Return the headers of one request and the key they carry (for redaction)."""
        key = self.settings.api_key()
        headers = {"accept": "text/event-stream" if stream else "application/json"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        return headers, key

    @asynccontextmanager
    async def open_events(
        self, path: str, body: Mapping[str, Any]
    ) -> AsyncIterator[tuple[AsyncIterator[ServerSentEvent], str | None, Any]]:
        """Yield the server-sent events of ``POST path``, the key (for redaction), and the
        whole answer when the server sent JSON instead of a stream (else None).

        Raise ``ProviderFailure`` for an error status or a transport failure before the
        body; transport errors while reading the events are left to the caller.
        """
        headers, key = self.request_headers(stream=True)
        headers["content-type"] = "application/json"
        async with self._http.open_events(path, body, headers, key) as (events, whole):
            yield events, key, whole

    async def stream_events(
        self,
        path: str,
        body: Mapping[str, Any],
        new_state: Callable[[str | None], StreamState],
        terminal: str,
    ) -> AsyncGenerator[InferenceEvent, None]:
        """Yield the inference events of a streamed ``POST path``, decoded by a stream state.

        The terminal events (those that finish the state) go out only after the body is
        settled and the connection released: the runtime closes the generator as soon as it
        sees them. A stream that ends before ``terminal`` raises ``STREAM_INTERRUPTED``.
        """
        headers, key = self.request_headers(stream=True)
        headers["content-type"] = "application/json"
        stream = self._http.stream_events(path, body, headers, key, new_state(key), terminal)
        async with aclosing(stream) as events:
            async for event in events:
                yield event

    async def request_json(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Any:
        """Return the JSON answer of a non-streaming request; raise ``ProviderFailure``."""
        headers, key = self.request_headers(stream=False)
        if body is not None:
            headers["content-type"] = "application/json"
        return await self._http.request_json(method, path, body, headers, key)

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the configured models, or the server's ``GET /models`` list."""
        if self.settings.models:
            return self.settings.models
        data = await self.request_json("GET", "models")
        entries = data.get("data", []) if isinstance(data, dict) else []
        window = self.settings.context_window
        return tuple(
            ModelDescriptor(str(entry["id"]), context_window=window)
            for entry in entries
            if isinstance(entry, dict) and entry.get("id")
        )

    def model_for(self, requested: str) -> str:
        """Return the model to call: the request's, or the table's ``model`` for a placeholder.

        The runtime names a model ``<engine id>-default`` when none is configured; the
        engine's own ``model`` setting then applies. Raise ``ProviderFailure`` (invalid
        request) when there is none: a clear error beats the server's "model not found".
        """
        if requested and requested != f"{self.id}-default":
            return requested
        if self.settings.model:
            return self.settings.model
        raise ProviderFailure(
            ProviderFailureKind.INVALID_REQUEST,
            f"no model chosen for engine {self.id!r}: pass --model, set default_model in "
            f"config.toml, or set model in [engines.{self.id}]",
        )
