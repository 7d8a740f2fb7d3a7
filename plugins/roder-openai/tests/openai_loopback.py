"""A real HTTP server on 127.0.0.1 for the engine tests, driven by fixture files.

It speaks HTTP/1.1 from a thread (``http.server``), records every request, and answers each
path from a queue of :class:`Reply` values: a status, headers and body pieces written and
flushed one at a time (server-sent events go out event by event, as a provider sends
them). A reply can stop half-way and drop the connection, like a cut stream.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"

TEST_KEY = "sk-loopback-test-key-do-not-leak-0123456789"
"""The key the tests hand the engines; it must never show up in errors or the store."""

KEY_ENV = "RODER_TEST_OPENAI_KEY"
"""The environment variable that carries :data:`TEST_KEY`."""


def fixture_bytes(name: str) -> bytes:
    """Return a fixture file's bytes."""
    return (FIXTURES / name).read_bytes()


def sse_events(name: str) -> list[bytes]:
    """Return a ``.sse`` fixture split into its events, each ending in a blank line."""
    text = fixture_bytes(name).replace(b"\r\n", b"\n")
    return [block.strip(b"\n") + b"\n\n" for block in text.split(b"\n\n") if block.strip(b"\n")]


@dataclass
class Reply:
    """One scripted answer: ``chunks`` are written and flushed one by one.

    ``cut_after``: drop the connection after that many chunks, without ending the body.
    ``chunked``: use chunked transfer encoding (otherwise the body ends when the connection
    closes). ``delay``: seconds to wait before each chunk. ``pause_before_end``: seconds to
    wait after the last chunk before the body ends (a server that lingers).
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    chunked: bool = True
    cut_after: int | None = None
    delay: float = 0.0
    pause_before_end: float = 0.0


def sse_reply(name: str, **kwargs: Any) -> Reply:
    """Return a streamed reply of a ``.sse`` fixture, one event per chunk."""
    return Reply(headers={"content-type": "text/event-stream"}, chunks=sse_events(name), **kwargs)


def json_reply(name: str, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """Return a JSON reply of a fixture file."""
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        chunks=[fixture_bytes(name)],
        chunked=False,
    )


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int = 0

    def json(self) -> Any:
        """Return the body parsed as JSON."""
        return json.loads(self.body)


class LoopbackServer:
    """The server: ``expect(path, reply)`` queues answers; ``requests`` records requests."""

    def __init__(self) -> None:
        self.replies: dict[str, deque[Reply]] = {}
        self.fallbacks: dict[str, Reply] = {}
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

            def do_GET(self) -> None:
                server._answer(self)

            def do_POST(self) -> None:
                server._answer(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval makes shutdown() quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        """Return the port the server listens on."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """Return the base URL an engine is configured with (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def expect(self, path: str, *replies: Reply) -> None:
        """Queue replies for ``path`` (relative to ``/v1``, for example ``/responses``)."""
        with self._lock:
            self.replies.setdefault(path, deque()).extend(replies)

    def posted(self, path: str) -> list[Recorded]:
        """Return the POST requests made to ``path``, in order."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path == path]

    def always(self, path: str, reply: Reply) -> None:
        """Answer ``path`` with ``reply`` whenever no queued reply is left."""
        with self._lock:
            self.fallbacks[path] = reply

    def start(self) -> LoopbackServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        path = handler.path.removeprefix("/v1")
        with self._lock:
            self.requests.append(
                Recorded(
                    handler.command,
                    path,
                    {k.lower(): v for k, v in handler.headers.items()},
                    body,
                    int(handler.client_address[1]),
                )
            )
            queue = self.replies.get(path)
            reply = queue.popleft() if queue else self.fallbacks.get(path)
        if reply is None:
            reply = Reply(
                status=404,
                headers={"content-type": "application/json"},
                chunks=[b'{"error": {"message": "no reply scripted", "code": "not_found"}}'],
                chunked=False,
            )
        try:
            self._write(handler, reply)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True  # the client went away first

    def _write(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        handler.send_response(reply.status)
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        # Without chunking, a body is sized unless it is meant to stop early or trickle:
        # then it ends when the connection closes.
        close_delimited = not reply.chunked and (reply.cut_after is not None or reply.delay > 0)
        if reply.chunked:
            handler.send_header("transfer-encoding", "chunked")
        elif close_delimited:
            handler.send_header("connection", "close")
        else:
            handler.send_header("content-length", str(sum(len(c) for c in reply.chunks)))
        handler.end_headers()
        handler.wfile.flush()
        for index, chunk in enumerate(reply.chunks):
            if reply.cut_after is not None and index >= reply.cut_after:
                # Drop the connection mid-body: no terminating chunk, nothing more.
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.delay:
                time.sleep(reply.delay)
            if reply.chunked:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            else:
                handler.wfile.write(chunk)
            handler.wfile.flush()
        if reply.pause_before_end:
            time.sleep(reply.pause_before_end)
        if reply.chunked:
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        elif close_delimited:
            handler.close_connection = True


def running_server() -> Iterator[LoopbackServer]:
    """Yield a started server, stopped afterwards (a fixture body)."""
    server = LoopbackServer().start()
    try:
        yield server
    finally:
        server.stop()
