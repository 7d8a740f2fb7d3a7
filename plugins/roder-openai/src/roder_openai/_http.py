"""HTTP plumbing shared by both engines: the client, headers, and errors mapped to failures."""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any, Protocol

import anyio
import httpx
import orjson

from roder_api.inference import (
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    ModelDescriptor,
    ProviderFailure,
    ProviderFailureKind,
)
from roder_openai._settings import EngineSettings
from roder_openai._sse import ServerSentEvent, aiter_sse

_KEY_PATTERN = re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-*.]{4,}")
"""Things that look like API keys (also the masked ones some servers echo back)."""

MAX_ERROR_BODY = 64 * 1024
"""How much of an error response's body is kept to explain the failure."""

SETTLE_SECONDS = 1.0
"""How long the end of a body is awaited after the stream's terminal event."""


def redact(text: str, key: str | None) -> str:
    """Return ``text`` with the API key, and anything shaped like a key, blanked out."""
    if key:
        text = text.replace(key, "[redacted]")
    return _KEY_PATTERN.sub("[redacted]", text)


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Return the server's retry hint in seconds (``retry-after-ms``, then ``Retry-After``)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = -1.0
        if value >= 0:
            return value
    after = headers.get("retry-after")
    if after is None:
        return None
    try:
        value = float(after)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(after)
        except (TypeError, ValueError):
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, value)
    return value if value >= 0 else None


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
    said = redact(message, key) or httpx.codes.get_reason_phrase(status) or "error"
    text = f"HTTP {status}" + (f" ({code})" if code else "") + f": {said}"
    if status == 429:
        return ProviderFailure(
            ProviderFailureKind.RATE_LIMITED, text, retry_after=retry_after_seconds(headers)
        )
    if status >= 500:
        return ProviderFailure(
            ProviderFailureKind.OVERLOADED, text, retry_after=retry_after_seconds(headers)
        )
    if status in (401, 403):
        return ProviderFailure(ProviderFailureKind.AUTHENTICATION, text)
    if is_context_length_error(code, kind, message):
        return ProviderFailure(ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED, text)
    return ProviderFailure(ProviderFailureKind.INVALID_REQUEST, text)


CONTEXT_ERROR_MARKS = (
    "context_length_exceeded",  # OpenAI's code
    "exceed_context_size",  # llama.cpp's error type
    "exceeds the context window",  # OpenAI's message
    "exceeds the available context size",  # llama.cpp
    "maximum context length",  # vLLM and OpenAI-compatible proxies
)
"""What an error's code, type or message holds when the input is over the window."""

CHARS_PER_TOKEN_ESTIMATE = 4
"""Characters per token for the size reported when input is refused as too large."""

CHARS_PER_TOKEN_BOUND = 6
"""Characters per token for the refusal itself: a generous bound, so that only input that
certainly cannot fit is refused (dense text has fewer characters per token, not more)."""


def is_context_length_error(code: str | None, kind: str | None, message: str) -> bool:
    """Return True when an error says the input is over the model's context window."""
    said = f"{code or ''} {kind or ''} {message}".lower()
    return any(mark in said for mark in CONTEXT_ERROR_MARKS)


def text_characters(value: Any, skip: frozenset[str] = frozenset()) -> int:
    """Return how many characters of text ``value`` (a request's input) holds.

    Keys in ``skip`` (opaque ciphertext, ids, types) are not counted.
    """
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(text_characters(v, skip) for k, v in value.items() if k not in skip)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return sum(text_characters(v, skip) for v in value)
    return 0


def check_fits(model: str, window: int | None, characters: int) -> None:
    """Raise ``CONTEXT_WINDOW_EXCEEDED`` when ``characters`` of input cannot fit ``window``.

    Nothing is sent: a request the server must refuse is refused here, with its size, and
    is not retried.
    """
    if not window or characters // CHARS_PER_TOKEN_BOUND <= window:
        return
    estimate = -(-characters // CHARS_PER_TOKEN_ESTIMATE)
    raise ProviderFailure(
        ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED,
        f"the request is about {estimate} tokens ({characters} characters of text), more "
        f"than the context window of model {model!r} ({window} tokens); nothing was sent. "
        "Shorten the message, or compact or start a new thread",
    )


def failure_for_exception(
    error: httpx.HTTPError, *, streaming: bool, where: str = ""
) -> ProviderFailure:
    """Return the failure for a transport error; ``streaming``: after the response began.

    ``where`` (``engine 'ollama' at http://127.0.0.1:11434/v1``) leads the message, so that
    a person knows which server to look at.
    """
    name = type(error).__name__
    lead = f"{where}: " if where else ""
    if isinstance(error, httpx.TimeoutException):
        return ProviderFailure(ProviderFailureKind.TIMEOUT, f"{lead}the request timed out ({name})")
    if streaming:
        return ProviderFailure(
            ProviderFailureKind.STREAM_INTERRUPTED,
            f"{lead}the response stream was cut before it completed ({name})",
        )
    if isinstance(error, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)):
        return ProviderFailure(
            ProviderFailureKind.NETWORK, f"{lead}could not reach the server ({name}: {error})"
        )
    return ProviderFailure(ProviderFailureKind.OTHER, f"{lead}HTTP client error ({name}: {error})")


class StreamState(Protocol):
    """Turns one provider's server-sent events into inference events.

    ``failure``, when set with the last events, is raised after they are yielded (a
    provider error of a kind the runtime must see, with its usage still billed).
    """

    finished: bool
    failure: ProviderFailure | None

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        """Return the events of one server-sent event; set ``finished`` on the last."""
        ...

    def answer(self, data: Any) -> list[InferenceEvent]:
        """Return the events of a whole JSON answer to a streamed request; finish."""
        ...


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
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def where(self) -> str:
        """Return which engine talks to which server (``engine 'ollama' at http://...``)."""
        return f"engine {self.id!r} at {self.settings.base_url}"

    def __repr__(self) -> str:
        # The key is never an attribute, so nothing here can print it.
        return f"{type(self).__name__}(id={self.id!r}, base_url={self.settings.base_url!r})"

    def client(self) -> httpx.AsyncClient:
        """Return the engine's HTTP client, made on first use."""
        if self._client is None:
            settings = self.settings
            self._client = httpx.AsyncClient(
                base_url=settings.base_url + "/",
                transport=self._transport,
                timeout=httpx.Timeout(
                    settings.timeout,
                    connect=settings.connect_timeout,
                    read=settings.read_timeout,
                ),
                headers={"user-agent": "roder-openai/0.1"},
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client (a new one is made if the engine is used again)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

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
        client = self.client()
        request = client.build_request("POST", path, content=orjson.dumps(body), headers=headers)
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise failure_for_exception(error, streaming=False, where=self.where) from None
        try:
            if response.status_code >= 300:
                try:
                    error_body = (await response.aread())[:MAX_ERROR_BODY]
                except httpx.HTTPError:
                    error_body = b""
                raise failure_for_status(response.status_code, response.headers, error_body, key)
            if response.headers.get("content-type", "").startswith("application/json"):
                # Some OpenAI-compatible servers answer a streamed request (with tools, say)
                # with the whole response: read it as the stream it stands for.
                try:
                    whole = orjson.loads(await response.aread())
                except (httpx.HTTPError, orjson.JSONDecodeError):
                    raise ProviderFailure(
                        ProviderFailureKind.OTHER,
                        f"the server answered POST {path} with JSON that cannot be read",
                    ) from None
                yield _no_events(), key, whole
                return
            chunks = response.aiter_bytes()
            try:
                async with aclosing(aiter_sse(chunks)) as events:
                    yield events, key, None
            except BaseException:
                await _settle(chunks, 0)
                raise
            await _settle(chunks, SETTLE_SECONDS)
        finally:
            await response.aclose()

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
        final: list[InferenceEvent] = []
        async with self.open_events(path, body) as (events, key, whole):
            state = new_state(key)
            if whole is not None:
                final = state.answer(whole)
            try:
                async for sse in events:
                    produced = state.handle(sse)
                    if state.finished:
                        final = produced
                        break
                    for event in produced:
                        yield event
            except httpx.HTTPError as error:
                raise failure_for_exception(error, streaming=True, where=self.where) from None
        if not state.finished:
            raise ProviderFailure(
                ProviderFailureKind.STREAM_INTERRUPTED,
                f"the response stream ended before {terminal}",
            )
        for event in final:
            yield event
        if state.failure is not None:
            raise state.failure

    async def request_json(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Any:
        """Return the JSON answer of a non-streaming request; raise ``ProviderFailure``."""
        headers, key = self.request_headers(stream=False)
        if body is not None:
            headers["content-type"] = "application/json"
        try:
            response = await self.client().request(
                method,
                path,
                content=orjson.dumps(body) if body is not None else None,
                headers=headers,
            )
        except httpx.HTTPError as error:
            raise failure_for_exception(error, streaming=False, where=self.where) from None
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


async def _no_events() -> AsyncGenerator[ServerSentEvent, None]:
    """Return an event stream with nothing in it (the answer came whole, as JSON)."""
    return
    yield  # pragma: no cover - makes this an async generator


async def _settle(chunks: AsyncIterator[bytes], seconds: float) -> None:
    """Run httpx's body iterator to its end, for at most ``seconds``.

    httpx reads a body through several nested async generators; closing only the outer
    one leaves the inner ones suspended, and trio warns when they are collected. Reading on
    lets them finish: at the end of the body (the connection can then be reused) or with
    the cancellation of the deadline (the connection is then closed).
    """
    with anyio.move_on_after(seconds):
        try:
            async for _ in chunks:
                pass
        except httpx.HTTPError:
            pass
