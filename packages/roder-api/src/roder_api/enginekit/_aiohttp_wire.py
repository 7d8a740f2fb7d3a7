"""aiohttp under :class:`~roder_api.enginekit.httpx_client.HttpxClient`, on asyncio.

An engine's streamed request is the hot path of a turn: measured against a local server
(``engine_bench.py`` E3; ``benchmarks/README.md``, "The engine's HTTP client"), aiohttp
reaches a stream's first event 0.4-0.7 ms sooner than httpx and spends under half of its
CPU per request, the rest being httpx's and httpcore's pure-Python layers. aiohttp runs
only on asyncio, so :func:`wire_for` picks it only there, for ``http``/``https`` servers,
when it is installed, with no proxy variable set (httpx reads those with rules of its
own) and no test transport; httpx does the rest, and ``RODER_ENGINE_HTTP=httpx`` asks for
httpx everywhere.

What the client sees does not change with the wire: an answer has the shape of the part
of ``httpx.Response`` the client reads (``status_code``, ``headers`` as
``httpx.Headers``, ``aread``, ``aiter_bytes``, ``aclose``), and aiohttp's errors are
raised as the httpx exceptions of the same meaning (a timeout as a
``httpx.TimeoutException``, a connection refused or cut as a ``httpx.NetworkError``...),
so that the failure mapping, and an engine that catches ``httpx.HTTPError`` itself, is one.
Trust roots are httpx's (``httpx.create_ssl_context``, made in a worker thread: it reads
the CA bundle). The timeouts mean what httpx's do: ``read`` between two reads,
``connect`` for the connection itself, and the whole ``timeout`` for the wait for a
pooled connection and the connect together; aiohttp has no write timeout (a request body
is small).
"""

from __future__ import annotations

import asyncio
import os
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import httpx

from roder_api.inference import request_sent

if TYPE_CHECKING:
    import aiohttp

WIRE_ENV = "RODER_ENGINE_HTTP"
"""The variable that picks an engine's HTTP client: ``httpx``, or ``aiohttp`` (the default,
where it can run)."""

WIRES = ("aiohttp", "httpx")
"""The values :data:`WIRE_ENV` accepts."""

KEEPALIVE_S = 4.0
"""How long an idle connection is kept for the next request: under the 5 s after which
common servers (uvicorn's default) close theirs, so that a request seldom meets a
connection the server is closing (one that does fails as a network error, retried)."""

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def wire_for(base_url: str, environ: Mapping[str, str] | None = None) -> str:
    """Return the wire a request to ``base_url`` uses here and now: ``aiohttp`` or ``httpx``.

    Raise ``ValueError`` naming :data:`WIRE_ENV` when it holds another value.
    """
    env = os.environ if environ is None else environ
    wanted = env.get(WIRE_ENV, "").strip().lower()
    if wanted not in ("", *WIRES):
        raise ValueError(f"{WIRE_ENV} must be one of {', '.join(WIRES)}, not {wanted!r}")
    if wanted == "httpx" or not base_url.startswith(("http://", "https://")):
        return "httpx"
    if any(env.get(name) or env.get(name.upper()) for name in _PROXY_VARIABLES):
        return "httpx"
    try:
        asyncio.get_running_loop()  # anyio's asyncio backend (trio runs no asyncio loop)
    except RuntimeError:
        return "httpx"
    return "aiohttp" if _aiohttp() is not None else "httpx"


def _aiohttp() -> Any:
    try:
        import aiohttp
    except ImportError:
        return None
    return aiohttp


def http_error(error: BaseException, *, started: bool) -> httpx.HTTPError:
    """Return the httpx exception that means what aiohttp's ``error`` means.

    ``started``: the answer had begun (a read of the body failed), else the request or
    the wait for the answer's head did.
    """
    aiohttp = _aiohttp()
    message = str(error) or type(error).__name__
    if isinstance(error, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        connecting = aiohttp is not None and isinstance(error, aiohttp.ConnectionTimeoutError)
        return httpx.ConnectTimeout(message) if connecting else httpx.ReadTimeout(message)
    if aiohttp is not None:
        if isinstance(error, aiohttp.ClientProxyConnectionError):
            return httpx.ProxyError(message)
        if isinstance(error, aiohttp.ClientConnectorError):
            return httpx.ConnectError(message)
        if isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
            return httpx.RemoteProtocolError(message)
        if isinstance(error, aiohttp.ClientResponseError):  # an answer that is not HTTP
            return httpx.RemoteProtocolError(message)
        if isinstance(error, (aiohttp.ClientOSError, aiohttp.ClientConnectionError)):
            return httpx.ReadError(message) if started else httpx.ConnectError(message)
    return httpx.TransportError(message)


def _caught() -> tuple[type[BaseException], ...]:
    aiohttp = _aiohttp()
    return (TimeoutError, aiohttp.ClientError) if aiohttp is not None else (TimeoutError,)


class AioAnswer:
    """An aiohttp answer with the part of ``httpx.Response`` that ``HttpxClient`` reads."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self._headers: httpx.Headers | None = None

    @property
    def headers(self) -> httpx.Headers:
        """The answer's headers (made on first use: the streaming path reads only one)."""
        if self._headers is None:
            self._headers = httpx.Headers(list(self._response.raw_headers))
        return self._headers

    async def aread(self) -> bytes:
        """Read the whole body."""
        try:
            return await self._response.read()
        except _caught() as error:
            raise http_error(error, started=True) from error

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """Yield the body's bytes as they arrive."""
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                yield chunk
        except _caught() as error:
            raise http_error(error, started=True) from error

    async def aclose(self) -> None:
        """Release the connection: back to the pool when the body was read to its end."""
        self._response.release()


class AiohttpWire:
    """One engine's aiohttp session (made on first use in each event loop) and its sends."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: httpx.Timeout,
        user_agent: str,
    ) -> None:
        self._base = base_url.rstrip("/") + "/"
        self._timeout = timeout
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession | None:
        session = self._session
        if session is not None and self._loop is asyncio.get_running_loop() and not session.closed:
            return session
        return None

    async def _open(self) -> aiohttp.ClientSession:
        session = self._current()
        if session is not None:
            return session
        ssl: ssl_module.SSLContext | bool = True
        if self._base.startswith("https:"):  # reads the CA bundle: not on the event loop
            ssl = await anyio.to_thread.run_sync(httpx.create_ssl_context)
            session = self._current()  # another request made it meanwhile
            if session is not None:
                return session
        aiohttp = _aiohttp()

        async def sent(*_: object) -> None:
            request_sent()  # in the task that writes the body: it has the caller's context

        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=self._timeout.pool,  # httpx's ``timeout``: the pool wait and connect
                sock_connect=self._timeout.connect,
                sock_read=self._timeout.read,
            ),
            headers={"user-agent": self._user_agent},
            trace_configs=[trace],
        )
        self._loop = asyncio.get_running_loop()
        return self._session

    async def send(
        self, method: str, path: str, content: bytes | None, headers: Mapping[str, str]
    ) -> AioAnswer:
        """Send a request to ``path`` (joined to the base URL as httpx joins it); return
        the answer once its head arrived (its body is read from the answer)."""
        session = await self._open()
        try:
            response = await session.request(
                method,
                self._base + path.lstrip("/"),
                data=content,
                headers=dict(headers),
                allow_redirects=False,  # as httpx: a redirect is an answer like any other
            )
        except _caught() as error:
            raise http_error(error, started=False) from error
        return AioAnswer(response)

    async def aclose(self) -> None:
        """Close the session (only in the event loop it belongs to; elsewhere drop it)."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        try:
            same_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            same_loop = False
        if same_loop:
            await session.close()
