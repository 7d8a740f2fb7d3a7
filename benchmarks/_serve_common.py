"""``roder serve`` processes and clients for serve_bench.py and the torture suite's serve mode."""

from __future__ import annotations

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
        env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
        env.update({"RODER_HOME": str(self.home / "home"), "PYTHONUNBUFFERED": "1"})
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


def stream_run(
    url: str, thread_id: str, text: str, on_event: Callable[[dict[str, Any]], None]
) -> None:
    """Post a run and read its events from the stream until the turn ends."""
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=60)) as c:
        after = c.get(f"/v1/threads/{thread_id}").json()["last_sequence"]
        response = c.post(f"/v1/threads/{thread_id}/runs", json={"input": text})
        assert response.status_code == 202, response.text
        params = {"after": after, "until": "turn_end"}
        with c.stream("GET", f"/v1/threads/{thread_id}/stream", params=params) as stream:
            for entry in sse_events(stream):
                on_event(entry)


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
