"""``roder serve`` in a subprocess: start it on a store, read its listening line, kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"
RODER = Path(sys.executable).with_name("roder")
PREFIX = "roder serve: listening on "
REPO = Path(__file__).resolve().parents[3]


def store_table(backend: str, home: Path, dsn: str, schema: str | None) -> str:
    """Return the ``[thread_store]`` table of a test config for ``backend``."""
    if backend == "jsonl":
        return f'[thread_store]\nbackend = "jsonl"\npath = "{home / "threads"}"\n'
    if backend == "sqlite":
        return f'[thread_store]\nbackend = "sqlite"\npath = "{home / "threads.sqlite"}"\n'
    return f'[thread_store]\nbackend = "postgres"\ndsn = "{dsn}"\nschema = "{schema}"\n'


def drop_schemas(dsn: str, schemas: list[str]) -> None:
    """Drop the test schemas (and the tenants' ones made from them)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s) OR nspname LIKE ANY(%s)",
            (schemas, [f"{s}_t_%" for s in schemas]),
        ).fetchall()
        for (name,) in rows:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


class Server:
    """One ``roder serve --port 0`` process (restartable on the same store and port 0)."""

    def __init__(
        self,
        home: Path,
        store: str,
        *,
        extra_config: str = "",
        top: str = "",
        args: tuple[str, ...] = (),
        env: dict[str, str],
    ) -> None:
        self.home = home
        self.config = home / "config.toml"
        self.config.write_text(
            top + store + "[engines.scripted]\ndelta_delay_ms = 20\n" + extra_config
        )
        self.args = args
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
        self.env.update({"RODER_HOME": str(home / "home"), "PYTHONUNBUFFERED": "1", **env})
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.stderr: list[str] = []

    def start(self, timeout_s: float = 60.0) -> str:
        """Start the server; return its base URL from the first stderr line."""
        self.stderr = []
        self.proc = subprocess.Popen(
            [str(RODER), "--config", str(self.config), "serve", "--port", "0", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        assert self.proc.stderr is not None
        first: list[str] = []
        got = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                if not first:
                    first.append(line)
                    got.set()
                self.stderr.append(line)
            got.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        assert got.wait(timeout_s), "roder serve printed nothing"
        assert first and first[0].startswith(PREFIX), f"first line: {first!r} {self.stderr}"
        self.url = first[0][len(PREFIX) :].strip()
        self.wait_ready()
        return self.url

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until ``/readyz`` answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"the server never became ready: {''.join(self.stderr)}")

    def kill(self) -> None:
        """SIGKILL the server (and its workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stderr is not None:
            self._drain.join(10)
            self.proc.stderr.close()

    def stop(self) -> int | None:
        """SIGTERM the server and wait for it; return its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._close()
        return self.proc.returncode

    def client(self, token: str | None = None) -> httpx.Client:
        """Return an HTTP client for the server (with a bearer token)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def read_sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Yield the SSE messages of a streaming response (``id``, ``event``, ``data``; a
    comment as ``{"comment": text}``)."""
    message: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if message:
                yield message
            message = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            field, _, value = line.partition(":")
            message[field] = value[1:] if value.startswith(" ") else value


def wait_run(
    client: httpx.Client, thread_id: str, turn_id: str, timeout_s: float = 60
) -> dict[str, Any]:
    """Wait until a run is completed or aborted; return its status JSON."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = client.get(f"/v1/threads/{thread_id}/runs/{turn_id}")
        if response.status_code == 200 and response.json()["status"] in ("completed", "aborted"):
            return dict(response.json())
        time.sleep(0.05)
    raise AssertionError(f"run {turn_id} did not end: {response.text}")


def journal(client: httpx.Client, thread_id: str) -> list[dict[str, Any]]:
    """Return a thread's whole journal through ``/events``."""
    events: list[dict[str, Any]] = []
    while True:
        page = client.get(f"/v1/threads/{thread_id}/events", params={"after": len(events)})
        assert page.status_code == 200, page.text
        batch = page.json()["events"]
        if not batch:
            return events
        events.extend(batch)


def tool_env(tmp_path: Path) -> dict[str, str]:
    """Return the environment that makes the example tool plugin (``word_count``)
    discoverable by a server, through a dist-info on the path."""
    site = tmp_path / "site"
    info = site / "roder_word_tools-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-word-tools\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[roder]\nword-tools = roder_word_tools\n")
    source = REPO / "examples" / "roder-word-tools" / "src"
    paths = [str(site), str(source), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


ASK = '[tools.approval]\nword_count = "ask"\n'
"""The config that makes ``word_count`` ask for approval."""
CALL = 'call word_count {"text": "one two three"}'
"""An input that has the scripted engine call ``word_count``."""


def wait_asked(c: httpx.Client, thread_id: str, count: int = 1) -> dict[str, Any]:
    """Return the ``count``-th approval request journaled on the thread (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        asked = [
            e["event"]
            for e in journal(c, thread_id)
            if e["event"]["type"] == "tool_approval_requested"
        ]
        if len(asked) >= count:
            return asked[-1]
        time.sleep(0.05)
    raise AssertionError("no approval was asked")


SDK_CLIENTS: list[Any] = []
"""The official SDK clients :func:`sdk` made; conftest's autouse fixture closes them after
each test (one left to the collector warns about its socket, an error under
``filterwarnings = error``, in whatever test runs then)."""


def sdk(server: Server, token: str = "unused") -> Any:
    """Return an ``openai.OpenAI`` client of ``server``'s OpenAI-compatible surface."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0, timeout=60)
    SDK_CLIENTS.append(client)
    return client


def close_sdk_clients() -> None:
    """Close every client :func:`sdk` made."""
    while SDK_CLIENTS:
        SDK_CLIENTS.pop().close()
