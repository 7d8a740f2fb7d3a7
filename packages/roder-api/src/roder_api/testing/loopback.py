"""A real HTTP server on 127.0.0.1 for engine tests, and the helpers engine tests share.

Standard library only (no pytest, no httpx): :class:`LoopbackServer` speaks HTTP/1.1 from a
thread (``http.server``), records every request (:class:`Recorded`), and answers each path
from a queue of :class:`Reply` values, writing and flushing body pieces one at a time
(server-sent events go out event by event, as a provider sends them). A reply can drop the
connection mid-body (``cut_after``), trickle (``delay``), linger before it ends
(``pause_before_end``) or be close-delimited (``chunked=False``).

A provider's own test module adds its wire format: fixture files or event builders, a
``check`` that refuses requests the real API would refuse (collected in ``problems``, which
:func:`running_server` asserts empty), and the provider's error answer (``error_reply``).
``roder-openai`` and ``roder-anthropic`` test against it; see ``docs/writing-an-engine.md``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import venv
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from roder_api.inference import (
    AgentInferenceRequest,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ReasoningDelta,
)
from roder_api.transcript import TranscriptItem, UserMessage


@dataclass
class Reply:
    """One scripted answer: ``chunks`` are written and flushed one by one.

    ``cut_after``: drop the connection after that many chunks, without ending the body.
    ``chunked``: use chunked transfer encoding (otherwise the body is sized, or ends when
    the connection closes if it is cut or trickles). ``delay``: seconds to wait before each
    chunk. ``pause_before_end``: seconds to wait after the last chunk before the body ends.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] = ()
    chunked: bool = True
    cut_after: int | None = None
    delay: float = 0.0
    pause_before_end: float = 0.0


@dataclass
class Recorded:
    """A request the server received (headers with lower-case names)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int = 0

    def json(self) -> Any:
        """Return the body parsed as JSON."""
        return json.loads(self.body)


def default_error_reply(status: int, message: str) -> Reply:
    """Return an OpenAI-style JSON error answer (``{"error": {"message", "code"}}``)."""
    code = "not_found" if status == 404 else "invalid_request"
    body = {"error": {"message": message, "code": code}}
    return Reply(
        status=status,
        headers={"content-type": "application/json"},
        chunks=[json.dumps(body).encode()],
        chunked=False,
    )


class _QuietServer(ThreadingHTTPServer):
    """Leaves out the traceback of a client that dropped its connection first."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """The server: ``expect(path, reply)`` queues answers; ``requests`` records requests.

    ``prefix`` (``/v1``) is part of :attr:`base_url` and left out of recorded paths;
    queries are left out too. ``check(recorded)`` returns why a request is refused (it is
    then answered ``error_reply(400, why)`` and the reason kept in ``problems``), or None.
    ``responder(recorded)``, when set, answers a request no queued reply is left for.
    """

    def __init__(
        self,
        *,
        prefix: str = "",
        check: Callable[[Recorded], str | None] | None = None,
        error_reply: Callable[[int, str], Reply] = default_error_reply,
    ) -> None:
        self.prefix = prefix
        self.replies: dict[str, deque[Reply]] = {}
        self.fallbacks: dict[str, Reply] = {}
        self.responder: Callable[[Recorded], Reply | None] | None = None
        self.requests: list[Recorded] = []
        self.problems: list[str] = []
        self._check = check
        self._error_reply = error_reply
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
        """Return the base URL an engine is configured with (``http://127.0.0.1:N<prefix>``)."""
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    def expect(self, path: str, *replies: Reply) -> None:
        """Queue replies for ``path`` (without the prefix, for example ``/responses``)."""
        with self._lock:
            self.replies.setdefault(path, deque()).extend(replies)

    def always(self, path: str, reply: Reply) -> None:
        """Answer ``path`` with ``reply`` whenever no queued reply is left."""
        with self._lock:
            self.fallbacks[path] = reply

    def posted(self, path: str) -> list[Recorded]:
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

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0].removeprefix(self.prefix)
        recorded = Recorded(
            handler.command,
            path,
            {k.lower(): v for k, v in handler.headers.items()},
            body,
            int(handler.client_address[1]),
        )
        problem = self._check(recorded) if self._check is not None else None
        with self._lock:
            self.requests.append(recorded)
            if problem is not None:
                self.problems.append(problem)
                reply: Reply | None = self._error_reply(400, problem)
            else:
                queue = self.replies.get(path)
                reply = queue.popleft() if queue else None
                if reply is None and self.responder is not None:
                    reply = self.responder(recorded)
                if reply is None:
                    reply = self.fallbacks.get(path)
        if reply is None:
            reply = self._error_reply(404, f"no reply scripted for {path}")
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


_Server = TypeVar("_Server", bound=LoopbackServer)


def running_server(server: _Server) -> Iterator[_Server]:
    """Yield ``server`` started, stop it afterwards, and fail on anything it refused.

    The body of a fixture: ``yield from running_server(LoopbackServer(...))``.
    """
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.problems, f"the loopback server refused requests: {server.problems}"


# --- calling an engine and collecting what it streams ----------------------------------------

TURN_CTX = InferenceTurnContext("thread_loopback", "turn_1", "step_1")
"""A turn's context for calling an engine directly."""

COMPACT_CTX = InferenceTurnContext("thread_loopback", "turn_2", "step_2", purpose="compaction")
"""A compaction's context for calling an engine directly."""


def request_for(model: str, *items: TranscriptItem, **kwargs: Any) -> AgentInferenceRequest:
    """Return a request for ``model`` with the given transcript (a greeting by default).

    ``instructions`` and the other fields of ``AgentInferenceRequest`` are keywords.
    """
    transcript: Sequence[TranscriptItem] = items or (UserMessage("Hello?"),)
    return AgentInferenceRequest(
        model=model,
        instructions=kwargs.pop("instructions", None),
        transcript=tuple(transcript),
        **kwargs,
    )


async def collect(stream: AsyncIterator[InferenceEvent]) -> list[InferenceEvent]:
    """Return every event of a stream."""
    return [event async for event in stream]


async def collect_failure(
    stream: AsyncIterator[InferenceEvent],
) -> tuple[list[InferenceEvent], ProviderFailure]:
    """Return the events a stream yielded before it raised ``ProviderFailure``, and it."""
    events: list[InferenceEvent] = []
    try:
        async for event in stream:
            events.append(event)
    except ProviderFailure as failure:
        return events, failure
    raise AssertionError(f"the stream did not fail; it yielded {events}")


def text_of(events: Sequence[InferenceEvent]) -> str:
    """Return the message text the events carry."""
    return "".join(e.text for e in events if isinstance(e, MessageDelta))


def reasoning_of(events: Sequence[InferenceEvent]) -> str:
    """Return the reasoning text the events carry."""
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))


# --- the roder command -----------------------------------------------------------------------


def files_contain(root: Path, needle: bytes) -> bool:
    """Return True when any file under ``root`` holds ``needle`` (a key that must not leak)."""
    return any(needle in p.read_bytes() for p in root.rglob("*") if p.is_file())


def roder_env(home: Path, drop: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """Return this process's environment for a ``roder`` subprocess with ``RODER_HOME=home``.

    Every other ``RODER_*`` variable and the variables in ``drop`` (a real provider key)
    are left out; ``extra`` (the test key's variable) is added, and output is unbuffered.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_") and k not in drop}
    env.update(RODER_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def roder_subprocess(
    *args: str, env: dict[str, str], stdin: str = "", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``roder <args>`` (this interpreter's) in a subprocess; return what it did."""
    return subprocess.run(
        [sys.executable, "-m", "roder_runtime", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def plugins_in_fresh_venv(directory: Path, *distributions: Path) -> dict[str, Any]:
    """Install ``distributions`` into a new venv in ``directory``; return ``roder plugins``.

    The answer is ``roder plugins --json`` by plugin name, run with a ``RODER_HOME`` of its
    own and no other ``RODER_*`` variable. Slow (a pip install): minutes on a busy machine.
    """
    env_dir = directory / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    install = subprocess.run(
        [*pip, *map(str, distributions)], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stderr
    listed = subprocess.run(
        [str(env_dir / "bin" / "roder"), "plugins", "--json"],
        capture_output=True,
        text=True,
        env=roder_env(directory / "home"),
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    return {p["name"]: p for p in json.loads(listed.stdout)}


__all__ = [
    "COMPACT_CTX",
    "LoopbackServer",
    "Recorded",
    "Reply",
    "TURN_CTX",
    "collect",
    "collect_failure",
    "default_error_reply",
    "files_contain",
    "plugins_in_fresh_venv",
    "reasoning_of",
    "request_for",
    "roder_env",
    "roder_subprocess",
    "running_server",
    "text_of",
]
