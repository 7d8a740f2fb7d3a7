"""The engine kit's two wires (``HttpxClient`` over aiohttp on asyncio, over httpx elsewhere)
against a real server on a socket: the same answers, the same failures, the same headers
handed to an engine's error mapping; and when each wire is picked."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import certifi
import httpx
import pytest

from roder_api.enginekit import error_failure, event_json
from roder_api.enginekit._aiohttp_wire import WIRE_ENV, wire_for
from roder_api.enginekit.httpx_client import HttpxClient
from roder_api.inference import (
    Completed,
    InferenceEvent,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    on_request_sent,
)
from roder_api.testing.loopback import LoopbackServer, Reply, running_server

K = ProviderFailureKind
WIRES = ["aiohttp", "httpx"]


class State:
    """A stream state: ``delta`` events are text, ``done`` finishes."""

    def __init__(self) -> None:
        self.finished = False
        self.failure: ProviderFailure | None = None

    def handle(self, sse: Any) -> list[InferenceEvent]:
        if sse.event == "done":
            self.finished = True
            return [Completed(stop_reason="stop")]
        return [MessageDelta(str(event_json(sse)["text"]))]

    def answer(self, data: Any) -> list[InferenceEvent]:
        self.finished = True
        return [MessageDelta(str(data["text"])), Completed(stop_reason="whole")]


seen_headers: list[httpx.Headers] = []


def status_failure(
    status: int, headers: httpx.Headers, body: bytes, key: str | None
) -> ProviderFailure:
    seen_headers.append(headers)
    return error_failure(status, body[:40].decode(), key)


def client_for(base_url: str, *, read_timeout: float = 5.0) -> HttpxClient:
    return HttpxClient(
        base_url=base_url,
        timeout=10,
        connect_timeout=2,
        read_timeout=read_timeout,
        user_agent="wire-test/1",
        status_failure=status_failure,
        where="engine 'w'",
    )


def sse(*events: tuple[str, str]) -> list[bytes]:
    return [f"event: {name}\ndata: {data}\n\n".encode() for name, data in events]


STREAM = sse(("delta", '{"text": "hel"}'), ("delta", '{"text": "lo"}'), ("done", "{}"))


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    yield from running_server(LoopbackServer(prefix="/v1"))


@pytest.fixture(params=WIRES)
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs over each wire, on asyncio (the only loop aiohttp runs on)."""
    monkeypatch.setenv(WIRE_ENV, request.param)
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return str(request.param)


def run(coro: Any) -> Any:
    return anyio.run(coro, backend="asyncio")


async def stream(client: HttpxClient) -> list[InferenceEvent]:
    try:
        headers = {"authorization": "Bearer sk-w", "content-type": "application/json"}
        events = client.stream_events("chat", {"a": 1}, headers, "sk-w", State(), "done")
        return [event async for event in events]
    finally:
        await client.aclose()


def test_wire_for_picks_aiohttp_only_where_it_can_run() -> None:
    url = "http://127.0.0.1:1/v1"
    assert wire_for(url, {}) == "httpx"  # no event loop running

    async def inside(environ: dict[str, str], base: str = url) -> str:
        return wire_for(base, environ)

    assert run(lambda: inside({})) == "aiohttp"
    assert run(lambda: inside({WIRE_ENV: "aiohttp"})) == "aiohttp"
    assert run(lambda: inside({WIRE_ENV: "HTTPX"})) == "httpx"
    assert run(lambda: inside({"HTTPS_PROXY": "http://proxy:3128"})) == "httpx"
    assert run(lambda: inside({"all_proxy": "socks5://proxy:1080"})) == "httpx"
    assert run(lambda: inside({}, "unix:///run/x.sock")) == "httpx"
    assert anyio.run(lambda: inside({}), backend="trio") == "httpx"
    with pytest.raises(ValueError, match=f"{WIRE_ENV} must be one of aiohttp, httpx, not 'h3'"):
        run(lambda: inside({WIRE_ENV: "h3"}))


def test_a_bad_wire_setting_is_a_failure_that_names_it(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WIRE_ENV, "curl")
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(server.base_url)))
    assert caught.value.kind is K.OTHER
    said = f"engine 'w': {WIRE_ENV} must be one of aiohttp, httpx, not 'curl'"
    assert caught.value.message == said
    assert server.requests == []


def test_a_stream_arrives_the_same_over_each_wire(
    server: LoopbackServer, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.expect("/chat", Reply(headers={"content-type": "text/event-stream"}, chunks=STREAM))
    told: list[str] = []
    sent_by_aiohttp: list[str] = []  # the request went out over aiohttp (counted, not faked)
    request = aiohttp.ClientSession.request

    def counted(self: aiohttp.ClientSession, method: str, *args: Any, **kwargs: Any) -> Any:
        sent_by_aiohttp.append(method)
        return request(self, method, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "request", counted)

    async def main() -> list[InferenceEvent]:
        with on_request_sent(lambda: told.append("sent")):
            return await stream(client_for(server.base_url))

    events = run(main)
    assert sent_by_aiohttp == (["POST"] if wire == "aiohttp" else [])
    assert [type(e) for e in events] == [MessageDelta, MessageDelta, Completed]
    assert "".join(e.text for e in events if isinstance(e, MessageDelta)) == "hello"
    (got,) = server.requests
    assert (got.method, got.path, got.body) == ("POST", "/chat", b'{"a":1}')
    assert got.headers["authorization"] == "Bearer sk-w"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["user-agent"] == "wire-test/1"
    assert told and set(told) == {"sent"}


def test_streams_one_after_another_then_a_json_answer(server: LoopbackServer, wire: str) -> None:
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=STREAM, chunked=False)
    server.expect("/chat", reply, reply)
    server.expect("/models", Reply(headers={"content-type": "application/json"},
                                   chunks=[b'{"data": [{"id": "m"}]}'], chunked=False))  # fmt: skip

    async def main() -> tuple[Any, Any]:
        client = client_for(server.base_url)
        try:
            headers = {"content-type": "application/json"}
            for _ in range(2):  # the second on the connection the first left (keep-alive)
                events = client.stream_events("chat", {}, headers, None, State(), "done")
                assert len([e async for e in events]) == 3
            return await client.request_json("GET", "models", None, {}, None), None
        finally:
            await client.aclose()

    assert run(main)[0] == {"data": [{"id": "m"}]}
    assert [r.path for r in server.requests] == ["/chat", "/chat", "/models"]


def test_an_error_status_reaches_the_mapping_with_httpx_headers(
    server: LoopbackServer, wire: str
) -> None:
    seen_headers.clear()
    server.expect(
        "/chat",
        Reply(status=429, headers={"retry-after": "7", "content-type": "application/json"},
              chunks=[b'{"error": {"message": "slow down"}}']),
    )  # fmt: skip
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(server.base_url)))
    assert caught.value.kind is K.RATE_LIMITED
    (headers,) = seen_headers
    assert isinstance(headers, httpx.Headers) and headers["Retry-After"] == "7"


def test_a_redirect_is_an_answer_not_followed(server: LoopbackServer, wire: str) -> None:
    server.expect("/chat", Reply(status=307, headers={"location": "/v1/elsewhere"}))
    with pytest.raises(ProviderFailure):
        run(lambda: stream(client_for(server.base_url)))
    assert [r.path for r in server.requests] == ["/chat"]


def test_a_stream_cut_midway_is_interrupted(server: LoopbackServer, wire: str) -> None:
    server.expect(
        "/chat", Reply(headers={"content-type": "text/event-stream"}, chunks=STREAM, cut_after=1)
    )
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(server.base_url)))
    assert caught.value.kind is K.STREAM_INTERRUPTED


def test_a_server_that_is_not_there_is_a_network_failure(wire: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(f"http://127.0.0.1:{port}/v1")))
    assert caught.value.kind is K.NETWORK
    assert caught.value.message.startswith("engine 'w': could not reach the server (ConnectError")


def test_a_silent_server_is_a_timeout(server: LoopbackServer, wire: str) -> None:
    server.expect(
        "/chat", Reply(headers={"content-type": "text/event-stream"}, chunks=STREAM, delay=1.0)
    )
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(server.base_url, read_timeout=0.2)))
    assert caught.value.kind is K.TIMEOUT
    assert caught.value.message.startswith("engine 'w': the request timed out (ReadTimeout")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TLS server on 127.0.0.1 with a self-signed certificate (made with the ``openssl``
    command); yield its base URL and the certificate's file."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    body = b"".join(STREAM)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}/v1", cert
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def test_https_trusts_what_httpx_trusts(
    tls_server: tuple[str, Path], wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over TLS each wire takes its trust roots from httpx (``SSL_CERT_FILE`` here): the
    server's certificate named there is trusted; with another bundle it is refused as a
    server that cannot be reached (fails if the aiohttp wire used its own roots)."""
    url, cert = tls_server
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    events = run(lambda: stream(client_for(url)))
    assert "".join(e.text for e in events if isinstance(e, MessageDelta)) == "hello"
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # a bundle without it
    with pytest.raises(ProviderFailure) as caught:
        run(lambda: stream(client_for(url)))
    assert caught.value.kind is K.NETWORK
    assert "could not reach the server (ConnectError" in caught.value.message
