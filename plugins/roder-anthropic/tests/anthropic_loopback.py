"""A real HTTP server on 127.0.0.1 that speaks the Messages API wire format, strictly.

It serves HTTP/1.1 from a thread (``http.server``), records every request, and answers each
path from a queue of :class:`Reply` values, writing and flushing body pieces one at a time
(server-sent events go out event by event). Every request body is checked against the
``anthropic`` SDK's request types, and every event and JSON answer it is given to send is
checked against the SDK's models before the test runs: a drift from the real format fails
the test (``problems`` collects what the server refused).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from anthropic_wire import (
    WireError,
    check_error,
    check_event,
    check_message,
    check_request,
)

TEST_KEY = "sk-ant-loopback-test-key-do-not-leak-0123456789"
"""The key the tests hand the engine; it must never show up in errors or the store."""

KEY_ENV = "RODER_TEST_ANTHROPIC_KEY"
"""The environment variable that carries :data:`TEST_KEY`."""


@dataclass
class Reply:
    """One scripted answer: ``chunks`` are written and flushed one by one.

    ``cut_after``: drop the connection after that many chunks, without ending the body.
    ``delay``: seconds to wait before each chunk.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    cut_after: int | None = None
    delay: float = 0.0


def sse_reply(events: Sequence[Mapping[str, Any]], **kwargs: Any) -> Reply:
    """Return a streamed reply of ``events`` (each checked against the SDK), one per chunk."""
    chunks = []
    for event in events:
        check_event(event)
        data = json.dumps(event, ensure_ascii=False)
        chunks.append(f"event: {event['type']}\ndata: {data}\n\n".encode())
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks, **kwargs)


def json_reply(data: Mapping[str, Any], status: int = 200, **headers: str) -> Reply:
    """Return a JSON reply: a message (2xx, checked) or an error body (checked)."""
    if status < 300:
        check_message(data)
    else:
        check_error(data)
    return Reply(
        status=status,
        headers={"content-type": "application/json", **headers},
        chunks=[json.dumps(data).encode()],
    )


def error_reply(status: int, kind: str, message: str, **headers: str) -> Reply:
    """Return an Anthropic error answer."""
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}
    return json_reply(body, status, **headers)


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """Return the body parsed as JSON."""
        return json.loads(self.body)


class _QuietServer(ThreadingHTTPServer):
    """Leaves out the traceback of a client that dropped its connection first."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """The server: ``expect(path, reply)`` queues answers; ``requests`` records requests."""

    def __init__(self) -> None:
        self.replies: dict[str, deque[Reply]] = {}
        self.fallbacks: dict[str, Reply] = {}
        self.responder: Callable[[Recorded], Reply | None] | None = None
        self.requests: list[Recorded] = []
        self.problems: list[str] = []
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

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        """Return the base URL the engine is configured with (no ``/v1``, as for the API)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def expect(self, path: str, *replies: Reply) -> None:
        """Queue replies for ``path`` (for example ``/v1/messages``)."""
        with self._lock:
            self.replies.setdefault(path, deque()).extend(replies)

    def always(self, path: str, reply: Reply) -> None:
        """Answer ``path`` with ``reply`` whenever no queued reply is left."""
        with self._lock:
            self.fallbacks[path] = reply

    def posted(self, path: str = "/v1/messages") -> list[Recorded]:
        """Return the POST requests made to ``path``, in order."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path == path]

    def start(self) -> LoopbackServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _check(self, recorded: Recorded) -> str | None:
        if recorded.method != "POST" or recorded.path != "/v1/messages":
            return None
        if "anthropic-version" not in recorded.headers:
            return "no anthropic-version header"
        try:
            body = recorded.json()
            check_request(body, stream=bool(body.get("stream")))
        except (WireError, ValueError, AttributeError) as error:
            return f"request refused: {error}"
        return None

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0]
        recorded = Recorded(
            handler.command, path, {k.lower(): v for k, v in handler.headers.items()}, body
        )
        problem = self._check(recorded)
        with self._lock:
            self.requests.append(recorded)
            if problem is not None:
                self.problems.append(problem)
                reply: Reply | None = error_reply(400, "invalid_request_error", problem)
            else:
                queue = self.replies.get(path)
                reply = queue.popleft() if queue else None
                if reply is None and self.responder is not None:
                    reply = self.responder(recorded)
                if reply is None:
                    reply = self.fallbacks.get(path)
        if reply is None:
            reply = error_reply(404, "not_found_error", f"no reply scripted for {path}")
        try:
            self._write(handler, reply)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True  # the client went away first

    def _write(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        handler.send_response(reply.status)
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        handler.wfile.flush()
        for index, chunk in enumerate(reply.chunks):
            if reply.cut_after is not None and index >= reply.cut_after:
                handler.close_connection = True  # drop the connection mid-body
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.delay:
                time.sleep(reply.delay)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()


def running_server() -> Iterator[LoopbackServer]:
    """Yield a started server, stopped afterwards; fail on anything it refused."""
    server = LoopbackServer().start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.problems, f"the loopback server refused requests: {server.problems}"


# --- wire-format builders ----------------------------------------------------------------


def usage(
    input_tokens: int = 12, output_tokens: int = 1, read: int = 0, created: int = 0
) -> dict[str, Any]:
    """Return a ``usage`` object as ``message_start`` carries it."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }


def message_start(msg_id: str = "msg_loopback_1", **usage_kwargs: int) -> dict[str, Any]:
    """Return a ``message_start`` event."""
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(**usage_kwargs),
        },
    }


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    """Return the events of one streamed text block."""
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        }
    ]
    for piece in pieces:
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            }
        )
    events.append({"type": "content_block_stop", "index": index})
    return events


def thinking_block(index: int, text: str, signature: str) -> list[dict[str, Any]]:
    """Return the events of one streamed thinking block with its signature."""
    start = {"type": "thinking", "thinking": "", "signature": ""}
    half = len(text) // 2
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text[:half]},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text[half:]},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        },
        {"type": "content_block_stop", "index": index},
    ]


def redacted_block(index: int, data: str) -> list[dict[str, Any]]:
    """Return the events of a redacted thinking block (it comes whole in its start)."""
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "redacted_thinking", "data": data},
        },
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, call_id: str, name: str, *parts: str) -> list[dict[str, Any]]:
    """Return the events of a tool use whose input streams as ``input_json_delta`` parts."""
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
        }
    ]
    for part in parts:
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
        )
    events.append({"type": "content_block_stop", "index": index})
    return events


def compaction_block(index: int, summary: str, **fields: Any) -> list[dict[str, Any]]:
    """Return the events of a ``compaction`` block: start, one whole delta, stop."""
    start: dict[str, Any] = {"type": "compaction", "content": None}
    delta: dict[str, Any] = {"type": "compaction_delta", "content": summary}
    delta.update(fields)
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


def message_end(
    stop_reason: str = "end_turn", output_tokens: int = 9, **extra_usage: Any
) -> list[dict[str, Any]]:
    """Return ``message_delta`` (stop reason, final usage) and ``message_stop``."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **extra_usage},
        },
        {"type": "message_stop"},
    ]


def ping() -> dict[str, Any]:
    """Return a ``ping`` event."""
    return {"type": "ping"}


def text_stream(*pieces: str, **usage_kwargs: int) -> list[dict[str, Any]]:
    """Return a whole stream that answers with text (a greeting by default)."""
    return [
        message_start(**usage_kwargs),
        ping(),
        *text_block(0, *(pieces or ("Hello", " from loopback."))),
        *message_end(),
    ]
