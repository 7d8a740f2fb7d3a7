"""The HTTP half of an HTTP engine: a lazily made client, streamed and JSON requests, and
transport errors mapped to ``ProviderFailure``.

This module imports ``httpx``, which is not a dependency of ``roder``: import it only from
an engine that depends on httpx itself (``roder_api.enginekit`` never imports it). On
asyncio, when aiohttp is installed, requests go out over aiohttp instead (under half the
CPU, the first event 0.4-0.7 ms sooner; :mod:`roder_api.enginekit._aiohttp_wire` says when);
everything an engine sees stays httpx's: its errors, its headers, its test transports.

:class:`HttpxClient` keeps the rules of ``docs/writing-an-engine.md`` section 4 in one
place: the terminal events go out only after the body is read to its end and the
connection released; a stream that ends before its terminal event is
``STREAM_INTERRUPTED``; leaving a stream early still runs httpx's nested body generators to
their end (trio warns about suspended ones), with a zero deadline when abandoned; once a
request's body is written, ``roder_api.inference.request_sent()`` tells the runtime (through
httpx's ``trace`` request extension).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Protocol

import anyio
import httpx
import orjson

from roder_api.enginekit._aiohttp_wire import AiohttpWire, wire_for
from roder_api.enginekit._failures import MAX_ERROR_BODY, transport_failure
from roder_api.enginekit._sse import ServerSentEvent, aiter_sse
from roder_api.inference import InferenceEvent, ProviderFailure, ProviderFailureKind, request_sent

SETTLE_SECONDS = 1.0
"""How long the end of a body is awaited after the stream's terminal event."""

StatusFailure = Callable[[int, httpx.Headers, bytes, "str | None"], ProviderFailure]
"""Maps an error answer (status, headers, the start of its body, the key) to a failure."""


class HttpSettings(Protocol):
    """What :meth:`HttpxClient.for_settings` reads from an engine's settings."""

    @property
    def base_url(self) -> str:
        """The server's base URL, without a trailing slash."""
        ...

    @property
    def timeout(self) -> float:
        """The whole request's timeout in seconds."""
        ...

    @property
    def connect_timeout(self) -> float:
        """The connect timeout in seconds."""
        ...

    @property
    def read_timeout(self) -> float:
        """The timeout in seconds between two reads of the answer."""
        ...


class _Answer(Protocol):
    """What is read of an answer: ``httpx.Response`` or the aiohttp wire's ``AioAnswer``."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> httpx.Headers: ...

    async def aread(self) -> bytes: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class StreamState(Protocol):
    """Turns one provider's server-sent events into inference events.

    ``finished`` is set by the event that ends the stream; ``failure``, when set with the
    last events, is raised after they are yielded (a provider error of a kind the runtime
    must see, with its usage still billed).
    """

    finished: bool
    failure: ProviderFailure | None

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        """Return the events of one server-sent event; set ``finished`` on the last."""
        ...

    def answer(self, data: Any) -> list[InferenceEvent]:
        """Return the events of a whole JSON answer to a streamed request; finish."""
        ...


def failure_for_exception(
    error: httpx.HTTPError, *, streaming: bool, where: str = ""
) -> ProviderFailure:
    """Return the failure for an httpx transport error; ``streaming``: after the answer began.

    Timeouts are ``TIMEOUT``; an error after the answer began is ``STREAM_INTERRUPTED``;
    a network, protocol or proxy error before it is ``NETWORK``; the rest ``OTHER``.
    """
    return transport_failure(
        error,
        timed_out=isinstance(error, httpx.TimeoutException),
        unreachable=isinstance(
            error, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)
        ),
        streaming=streaming,
        where=where,
    )


class HttpxClient:
    """One engine's HTTP client (made on first use, closed by :meth:`aclose`) and its calls.

    ``status_failure`` maps the provider's error answers; ``where`` leads transport error
    messages (``engine 'ollama' at http://...``); ``transport`` (an
    ``httpx.AsyncBaseTransport``) replaces the network, for tests. The key is never kept:
    each call is handed its headers and the key they carry, for redaction.

    On asyncio the requests go out over aiohttp when it is installed (the module docstring
    says when; ``RODER_ENGINE_HTTP=httpx`` keeps httpx): the same answers and the same
    failures either way.
    """

    def __init__(
        self,
        *,
        base_url: str,
        timeout: float,
        connect_timeout: float,
        read_timeout: float,
        user_agent: str,
        status_failure: StatusFailure,
        where: str = "",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.where = where
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout, read=read_timeout)
        self._user_agent = user_agent
        self._status_failure = status_failure
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._aio: AiohttpWire | None = None

    @classmethod
    def for_settings(
        cls,
        settings: HttpSettings,
        *,
        user_agent: str,
        status_failure: StatusFailure,
        where: str = "",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> HttpxClient:
        """Return the client of an engine's settings (base URL and timeouts)."""
        return cls(
            base_url=settings.base_url,
            timeout=settings.timeout,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            user_agent=user_agent,
            status_failure=status_failure,
            where=where,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def client(self) -> httpx.AsyncClient:
        """Return the httpx client, made on first use (it belongs to one event loop)."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url + "/",
                transport=self._transport,
                timeout=self._timeout,
                headers={"user-agent": self._user_agent},
            )
        return self._client

    async def aclose(self) -> None:
        """Close the client (a new one is made if it is used again)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        wire, self._aio = self._aio, None
        if wire is not None:
            await wire.aclose()

    def _wire(self) -> AiohttpWire | None:
        """Return the aiohttp wire when this request goes out over it, else None (httpx)."""
        if self._transport is not None:
            return None
        try:
            if wire_for(self.base_url) != "aiohttp":
                return None
        except ValueError as error:
            lead = f"{self.where}: " if self.where else ""
            raise ProviderFailure(ProviderFailureKind.OTHER, f"{lead}{error}") from None
        if self._aio is None:
            self._aio = AiohttpWire(
                self.base_url, timeout=self._timeout, user_agent=self._user_agent
            )
        return self._aio

    async def _send(
        self, method: str, path: str, content: bytes | None, headers: Mapping[str, str]
    ) -> _Answer:
        """Send a request; return its answer once its head arrived (the body unread).

        Raise ``ProviderFailure`` for a transport failure.
        """
        wire = self._wire()
        try:
            if wire is not None:
                return await wire.send(method, path, content, headers)
            client = self.client()
            request = client.build_request(
                method, path, content=content, headers=dict(headers), extensions=_sent()
            )
            return await client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise self.failure(error, streaming=False) from None

    def status_error(
        self, status: int, headers: Any, body: bytes, key: str | None, request: str
    ) -> ProviderFailure:
        """Return the failure for an error answer to ``request`` (``POST chat/completions``).

        A 404 says the URL is wrong rather than the request: like a transport error it is
        led by ``where`` and names the URL asked, so that a person knows what to fix.
        """
        failure = self._status_failure(status, headers, body, key)
        if status != 404:
            return failure
        method, _, path = request.partition(" ")
        lead = f"{self.where}: " if self.where else ""
        return ProviderFailure(
            failure.kind,
            f"{lead}{failure.message} ({method} {self.base_url}/{path.lstrip('/')} was not "
            "found: check base_url)",
            retry_after=failure.retry_after,
        )

    def failure(self, error: httpx.HTTPError, *, streaming: bool) -> ProviderFailure:
        """Return the failure for a transport error, led by ``where``."""
        return failure_for_exception(error, streaming=streaming, where=self.where)

    @asynccontextmanager
    async def open_events(
        self, path: str, body: Mapping[str, Any], headers: Mapping[str, str], key: str | None
    ) -> AsyncIterator[tuple[AsyncIterator[ServerSentEvent], Any]]:
        """Yield the server-sent events of ``POST path``, and the whole answer when the server
        sent JSON instead of a stream (else None).

        Raise ``ProviderFailure`` for an error status or a transport failure before the
        body; transport errors while reading the events are left to the caller.
        """
        response = await self._send("POST", path, orjson.dumps(body), headers)
        try:
            if response.status_code >= 300:
                try:
                    error_body = (await response.aread())[:MAX_ERROR_BODY]
                except httpx.HTTPError:
                    error_body = b""
                raise self.status_error(
                    response.status_code, response.headers, error_body, key, f"POST {path}"
                )
            if response.headers.get("content-type", "").startswith("application/json"):
                # Some servers answer a streamed request with the whole answer: read it as
                # the stream it stands for.
                try:
                    whole = orjson.loads(await response.aread())
                except (httpx.HTTPError, orjson.JSONDecodeError):
                    raise ProviderFailure(
                        ProviderFailureKind.OTHER,
                        f"the server answered POST {path} with JSON that cannot be read",
                    ) from None
                yield _no_events(), whole
                return
            chunks = response.aiter_bytes()
            try:
                async with aclosing(aiter_sse(chunks)) as events:
                    yield events, None
            except BaseException:
                await settle(chunks, 0)
                raise
            await settle(chunks, SETTLE_SECONDS)
        finally:
            await response.aclose()

    async def stream_events(
        self,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        key: str | None,
        state: StreamState,
        terminal: str,
    ) -> AsyncGenerator[InferenceEvent, None]:
        """Yield the inference events of a streamed ``POST path``, decoded by ``state``.

        The terminal events (those that finish the state) go out only after the body is
        settled and the connection released: the runtime closes the generator as soon as it
        sees them. A stream that ends before ``terminal`` raises ``STREAM_INTERRUPTED``.
        """
        final: list[InferenceEvent] = []
        async with self.open_events(path, body, headers, key) as (events, whole):
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
                raise self.failure(error, streaming=True) from None
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
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str],
        key: str | None,
    ) -> Any:
        """Return the JSON answer of a non-streamed request; raise ``ProviderFailure``."""
        content = orjson.dumps(body) if body is not None else None
        response = await self._send(method, path, content, headers)
        try:
            try:
                data = await response.aread()
            except httpx.HTTPError as error:  # as httpx's whole request: not a stream
                raise self.failure(error, streaming=False) from None
        finally:
            await response.aclose()
        if response.status_code >= 300:
            raise self.status_error(
                response.status_code,
                response.headers,
                data[:MAX_ERROR_BODY],
                key,
                f"{method} {path}",
            )
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProviderFailure(
                ProviderFailureKind.OTHER,
                f"the server answered {method} {path} with something that is not JSON",
            ) from None


async def _trace(name: str, info: Mapping[str, Any]) -> None:
    """httpcore's trace of a request: tell the runtime once its body is written."""
    if name.endswith(".send_request_body.complete"):  # http11. or http2.
        request_sent()


def _sent() -> dict[str, Any]:
    """Return the extensions of a request sent (httpx's documented ``trace``)."""
    return {"trace": _trace}


async def _no_events() -> AsyncGenerator[ServerSentEvent, None]:
    """Return an event stream with nothing in it (the answer came whole, as JSON)."""
    return
    yield  # pragma: no cover - makes this an async generator


async def settle(chunks: AsyncIterator[bytes], seconds: float) -> None:
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


__all__ = [
    "HttpSettings",
    "HttpxClient",
    "SETTLE_SECONDS",
    "StatusFailure",
    "StreamState",
    "failure_for_exception",
    "settle",
]
