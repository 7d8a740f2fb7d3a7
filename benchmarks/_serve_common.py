"""``roder serve`` processes and clients for serve_bench.py and the torture suite's serve mode."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import orjson

RODER = Path(sys.executable).with_name("roder")
PREFIX = "roder serve: listening on "
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_dsn() -> str | None:
    """Return the test PostgreSQL DSN when it answers, else None."""
    dsn = os.environ.get("RODER_TEST_POSTGRES_DSN") or DEFAULT_DSN
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - any reason: not reachable
        return None
    return dsn


KEPT_VARIABLES = ("RODER_EVENT_LOOP", "RODER_ENGINE_HTTP")
"""The ``RODER_`` variables a benchmarked server keeps from the caller's environment:
``RODER_EVENT_LOOP=asyncio python benchmarks/serve_bench.py`` measures asyncio's loop,
``RODER_ENGINE_HTTP=httpx python benchmarks/openai_bench.py`` the engine on httpx."""


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """Return the environment of a benchmarked ``roder serve``: the caller's without its
    ``RODER_`` settings (but :data:`KEPT_VARIABLES`), with ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_") or k in KEPT_VARIABLES}
    env.update(extra)
    return env


class ServeProcess:
    """One ``roder serve`` on a store in ``home`` (restartable; ``port`` fixed or 0)."""

    def __init__(
        self,
        home: Path,
        backend: str,
        *,
        delta_delay_ms: int = 0,
        workers: int = 1,
        max_streams: int = 1000,
        dsn: str = "",
        schema: str = "",
        port: int = 0,
        extra_config: str = "",
        dispatch: str = "inprocess",
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.dsn = dsn
        self.schema = schema
        if backend == "jsonl":
            store = f'[thread_store]\nbackend = "jsonl"\npath = "{home / "threads"}"\n'
        elif backend == "sqlite":
            store = f'[thread_store]\nbackend = "sqlite"\npath = "{home / "t.sqlite"}"\n'
        else:
            store = f'[thread_store]\nbackend = "postgres"\ndsn = "{dsn}"\nschema = "{schema}"\n'
        self.config = home / "config.toml"
        self.config.write_text(
            f'[server]\nmax_streams = {max_streams}\ndispatch = "{dispatch}"\n'
            + store
            + f"[engines.scripted]\ndelta_delay_ms = {delta_delay_ms}\n"
            + extra_config
        )
        self.workers = workers
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        """Return the server's process id."""
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> str:
        """Start the server; return its URL once ``/readyz`` answers."""
        env = server_env({"RODER_HOME": str(self.home / "home"), "PYTHONUNBUFFERED": "1"})
        args = [str(RODER), "--config", str(self.config), "serve", "--port", str(self.port)]
        if self.workers > 1:
            args += ["--workers", str(self.workers)]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        if not line.startswith(PREFIX):
            raise RuntimeError(f"roder serve did not start: {line}{self.proc.stderr.read()}")
        self.url = line[len(PREFIX) :].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        # Keep reading stderr so that the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self.proc.stderr.read, daemon=True)
        self._drain.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("roder serve never became ready")

    def kill(self) -> None:
        """SIGKILL the server and its workers."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stderr is not None and not self.proc.stderr.closed:
            self._drain.join(10)
            self.proc.stderr.close()

    def stop(self) -> None:
        """SIGTERM the server and wait (SIGKILL after 20 s)."""
        if self.proc is None or self.proc.poll() is not None:
            self._close()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close()

    def drop_schema(self) -> None:
        """Drop the PostgreSQL schema (and its tenants') this server used."""
        if not self.schema:
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = %s OR nspname LIKE %s",
                (self.schema, f"{self.schema}_t_%"),
            ).fetchall()
            for (name,) in rows:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))

    def __enter__(self) -> ServeProcess:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def sse_events(response: httpx.Response) -> Any:
    """Yield the journal events (decoded ``data:``) of an SSE response."""
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield orjson.loads(line[5:])


_CLIENTS = threading.local()


def thread_client(url: str) -> httpx.Client:
    """Return this thread's client of ``url``, kept open (keep-alive) for the thread's life:
    what a real client does, and the same for every server a benchmark compares."""
    clients: dict[str, httpx.Client] | None = getattr(_CLIENTS, "clients", None)
    if clients is None:
        clients = _CLIENTS.clients = {}
    client = clients.get(url)
    if client is None:
        client = clients[url] = httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=60))
    return client


def stream_run(
    url: str,
    thread_id: str,
    text: str,
    on_event: Callable[[dict[str, Any]], None],
    *,
    after: int | None = None,
) -> None:
    """Post a run and read its events from the stream until the turn ends (``after``: the
    thread's last sequence when the caller knows it, else it is asked for)."""
    c = thread_client(url)
    if after is None:
        after = c.get(f"/v1/threads/{thread_id}").json()["last_sequence"]
    response = c.post(f"/v1/threads/{thread_id}/runs", json={"input": text})
    assert response.status_code == 202, response.text
    params = {"after": after, "until": "turn_end"}
    with c.stream("GET", f"/v1/threads/{thread_id}/stream", params=params) as stream:
        for entry in sse_events(stream):
            on_event(entry)


async def _http(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    body: Any = None,
) -> tuple[int, dict[str, str]]:
    """Send one HTTP/1.1 request on an open connection; return the status and headers."""
    data = orjson.dumps(body) if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    writer.write(head.encode() + b"\r\n" + data)
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers


async def _chunks(reader: asyncio.StreamReader) -> Any:
    """Yield the chunks of a chunked response body until its last chunk."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        chunk = await reader.readexactly(size + 2)
        yield chunk[:-2]


async def _stream_run_async(
    host: str,
    port: int,
    thread_id: str,
    text: str,
    on_event: Callable[[dict[str, Any], float], None],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sse_reader, sse_writer = await asyncio.open_connection(host, port)
    try:
        status, headers = await _http(reader, writer, "GET", f"/v1/threads/{thread_id}")
        after = orjson.loads(await reader.readexactly(int(headers["content-length"])))
        # The stream is open (its `retry:` arrived) before the run is posted, as a
        # streaming client (EventSource) does and as the in-process consumer is.
        path = f"/v1/threads/{thread_id}/stream?after={after['last_sequence']}&until=turn_end"
        status, headers = await _http(sse_reader, sse_writer, "GET", path)
        assert status == 200 and headers.get("transfer-encoding") == "chunked", status
        chunks = _chunks(sse_reader)
        pending = await anext(chunks)
        assert pending.startswith(b"retry:"), pending
        run = {"input": text}
        status, headers = await _http(reader, writer, "POST", f"/v1/threads/{thread_id}/runs", run)
        answer = await reader.readexactly(int(headers["content-length"]))
        assert status == 202, answer
        async for chunk in chunks:
            arrived = time.time()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    on_event(orjson.loads(line[5:]), arrived)
    finally:
        writer.close()
        sse_writer.close()


def stream_runs_at_once(
    url: str,
    thread_ids: list[str],
    text: str,
    on_event: Callable[[dict[str, Any], float], None],
) -> None:
    """On each thread at once: open its stream, post a run, read the stream until the turn
    ends; from one event loop (raw HTTP/1.1, two connections a thread): a client that adds
    little of its own to the latency it measures. ``on_event(entry, arrived)`` gets each
    journal event with the ``time.time()`` its chunk arrived."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def main() -> None:
        await asyncio.gather(
            *(_stream_run_async(host, int(port), tid, text, on_event) for tid in thread_ids)
        )

    asyncio.run(main())


def first_event_ms(url: str) -> float:
    """Return the ms from POSTing a run on a fresh thread to its first streamed event (the
    stream is open before the POST)."""
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=60)) as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        opened = threading.Event()
        arrived: list[float] = []

        def listen() -> None:
            params = {"until": "turn_end"}
            with c.stream("GET", f"/v1/threads/{tid}/stream", params=params) as stream:
                for line in stream.iter_lines():
                    if line.startswith("retry:"):
                        opened.set()
                    elif line.startswith("id:") and not arrived:
                        arrived.append(time.perf_counter())

        reader = threading.Thread(target=listen)
        reader.start()
        assert opened.wait(30), "the stream never opened"
        start = time.perf_counter()
        assert c.post(f"/v1/threads/{tid}/runs", json={"input": "hi"}).status_code == 202
        reader.join(60)
        return (arrived[0] - start) * 1000


def rss_kib(pid: int) -> int:
    """Return the resident memory (KiB) of ``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total
