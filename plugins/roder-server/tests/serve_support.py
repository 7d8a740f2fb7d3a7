"""``roder serve`` in a subprocess: start it on a store, read its listening line, kill it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import tomllib

from roder_api.events import AssistantContentDelta, ContentPhase

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

    def worker_pids(self) -> list[int]:
        """Return the process ids of the server's workers (``--workers N``: its children;
        one process: the server itself)."""
        assert self.proc is not None
        children = [
            pid for pid, parent in _parents().items() if parent == self.proc.pid and _is_roder(pid)
        ]
        return sorted(children) or [self.proc.pid]

    def lease_holder_pid(self, thread_id: str) -> int | None:
        """Return the process id that holds the thread's lease now (read from the store:
        the lease file's holder JSON, or PostgreSQL's ``roder_leases`` row), or None."""
        table = tomllib.loads(self.config.read_text())["thread_store"]
        if table["backend"] == "postgres":
            import psycopg
            from psycopg import sql

            with psycopg.connect(table["dsn"], autocommit=True) as conn:
                query = sql.SQL("SELECT pid FROM {}.roder_leases WHERE thread_id = %s").format(
                    sql.Identifier(table["schema"])
                )
                row = conn.execute(query, (thread_id,)).fetchone()
            return int(row[0]) if row is not None else None
        path = Path(table["path"])
        leases = path / "leases" if table["backend"] == "jsonl" else Path(f"{path}.leases")
        try:
            data = (leases / f"{thread_id}.lease").read_bytes()
            return int(orjson.loads(data)["pid"]) if data else None
        except (OSError, orjson.JSONDecodeError, KeyError):
            return None

    def client(self, token: str | None = None) -> httpx.Client:
        """Return an HTTP client for the server (with a bearer token)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def serve_until_exit(
    config: Path, home: Path, *args: str, timeout_s: float
) -> tuple[int | None, str]:
    """Run ``roder --config CONFIG serve --port 0 ARGS`` (a ``RODER_HOME`` of its own) until
    it exits by itself; return its exit code and stderr (code None: it was still running
    after ``timeout_s`` and was killed, with its workers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(home)
    proc = subprocess.Popen(
        [str(RODER), "--config", str(config), "serve", "--port", "0", *args],
        cwd=home.parent,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
        return None, err
    return proc.returncode, err


class CountedReads:
    """Counts ``read_events`` on a real store (the store itself is untouched): ``reads``,
    and the ``after`` each asked for."""

    def __init__(self, store: Any) -> None:
        self.afters: list[int] = []
        read = store.read_events

        async def counted(thread_id: str, **kwargs: Any) -> Any:
            self.afters.append(kwargs.get("after", 0))
            return await read(thread_id, **kwargs)

        store.read_events = counted

    @property
    def reads(self) -> int:
        """How many reads so far."""
        return len(self.afters)


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _is_roder(pid: int) -> bool:
    try:
        return b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


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


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    """Wait until ``predicate()`` is true (polling); fail naming ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def collect(
    url: str | Callable[[], str],
    thread_id: str,
    got: list[dict[str, Any]],
    *,
    stop_after: int | None = None,
    read_s: float = 30,
) -> None:
    """Read a thread's stream (``until=turn_end``) from the last id in ``got`` (its
    Last-Event-ID) and append each message, until the turn ends, ``stop_after`` messages
    came, or the connection drops (the caller reconnects by calling again). ``url`` may be
    a function (a restarted server's new URL)."""
    base = url() if callable(url) else url
    headers = {"Last-Event-ID": got[-1]["id"]} if got else {}
    seen = 0
    try:
        with httpx.stream(
            "GET",
            f"{base}/v1/threads/{thread_id}/stream",
            params={"until": "turn_end"},
            headers=headers,
            timeout=httpx.Timeout(30, read=read_s),
        ) as response:
            assert response.status_code == 200, response.read()
            for message in read_sse(response):
                if "id" not in message:
                    continue
                got.append(message)
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    return
    except httpx.HTTPError:
        return  # the server went away: the caller reconnects


def kill_after_events(
    url: str, thread_id: str, kill: Callable[[], None], *, events: int = 10
) -> tuple[list[dict[str, Any]], threading.Thread]:
    """Read the thread's stream in a thread of its own; once ``events`` messages arrived,
    call ``kill`` (a SIGKILL of the server or worker running the turn). Return the messages
    read (the reader goes on until the connection drops) and the reader, to join."""
    got: list[dict[str, Any]] = []
    reader = threading.Thread(target=collect, args=(url, thread_id, got), daemon=True)
    reader.start()
    wait_for(lambda: len(got) >= events, f"{events} streamed events", 60)
    kill()
    return got, reader


def check_stream(got: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    """Assert that the streamed messages are the journal's first events: ids 1, 2, 3...
    (no gap, duplicate or reorder) and each ``data`` equal to the journaled event."""
    ids = [int(m["id"]) for m in got]
    assert ids == list(range(1, len(ids) + 1)), f"gap, duplicate or reorder: {ids}"
    assert [orjson.loads(m["data"]) for m in got] == events[: len(got)], (
        "a streamed event differs from the journal"
    )


class StreamReader:
    """A client that keeps one thread's stream open in a thread of its own: reconnects from
    the last id it saw (Last-Event-ID) whenever the connection drops, to whatever URL
    ``url()`` says then (a restarted server listens on a new port), until :meth:`close`."""

    def __init__(self, url: Callable[[], str], thread_id: str) -> None:
        self.url = url
        self.thread_id = thread_id
        self.got: list[dict[str, Any]] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def last(self) -> int:
        """Return the last id read (0: none yet)."""
        return int(self.got[-1]["id"]) if self.got else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            headers = {"Last-Event-ID": str(self.last)}
            try:
                with httpx.stream(
                    "GET",
                    f"{self.url()}/v1/threads/{self.thread_id}/stream",
                    headers=headers,
                    timeout=httpx.Timeout(10, read=10),
                ) as response:
                    if response.status_code != 200:
                        time.sleep(0.1)
                        continue
                    self.connections += 1
                    for message in read_sse(response):
                        if self._stop.is_set():
                            return
                        if "id" in message:
                            self.got.append(message)
            except httpx.HTTPError:
                time.sleep(0.1)  # the server is down or restarting: reconnect

    def wait_for_sequence(self, sequence: int, timeout_s: float = 60) -> None:
        """Wait until the reader has read up to ``sequence``."""
        wait_for(lambda: self.last >= sequence, f"the stream to reach {sequence}", timeout_s)

    def close(self) -> None:
        """Stop reading (the reader notices at its next message or keepalive)."""
        self._stop.set()
        self._thread.join(30)


def words(count: int, first: int = 0) -> list[AssistantContentDelta]:
    """Return ``count`` answer deltas of turn ``t1`` (``w<first> ``, ``w<first+1> ``, ...)."""
    return [
        AssistantContentDelta("t1", "s1", ContentPhase.FINAL_ANSWER, f"w{first + i} ")
        for i in range(count)
    ]


def stream_sequences(chunks: list[bytes]) -> list[int]:
    """Return the journal sequences of the events in a thread stream's SSE bytes."""
    messages = [m for m in b"".join(chunks).split(b"\n\n") if m.startswith(b"id: ")]
    return [orjson.loads(m.split(b"\ndata: ", 1)[1])["sequence"] for m in messages]


@contextlib.asynccontextmanager
async def two_stores(tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """Yield two JSONL store objects on one directory (``here``, and ``there`` standing for
    another process) with thread ``th`` created."""
    from roder_api.threads import ThreadMetadata
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    here = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    there = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        now = int(time.time() * 1000)
        await here.create_thread(ThreadMetadata("th", now, now))
        yield here, there
    finally:
        await here.aclose()
        await there.aclose()


async def stream_during(
    store: Any, append: Callable[[], Awaitable[object]], *, known_last: int | None = None
) -> list[bytes]:
    """Return the SSE bytes of thread ``th``'s stream from the start to its turn's end
    (``until_turn_end``), opened with a task group for its waits, while ``append()`` runs."""
    import anyio

    from roder_server import journal_stream

    chunks: list[bytes] = []
    async with anyio.create_task_group() as waits:
        stream = journal_stream(
            store,
            "th",
            0,
            heartbeat_s=30,
            until_turn_end=True,
            task_group=waits,
            known_last=known_last,
        )

        async def collect() -> None:
            async for chunk in stream:
                chunks.append(chunk)

        with anyio.fail_after(60):  # the stream ends at the turn end
            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)
                await append()
        waits.cancel_scope.cancel()
    return chunks
