"""serve_bench.py's peer: ``langgraph dev`` (``langgraph-cli[inmem]``) serving a one-node echo
graph, measured with the same runs/s and time-to-first-event workloads. Optional: without
the ``langgraph`` command the figures are skipped with a note."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from _serve_common import thread_client

GRAPH = """
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    text: str


def echo(state: State) -> State:
    return {"text": "You said: " + state["text"]}


builder = StateGraph(State)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
graph = builder.compile()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


LANGGRAPH_ENV = "RODER_BENCH_LANGGRAPH"
"""The variable naming the ``langgraph`` command to run, or the virtual environment that has
it (``langgraph-cli[inmem]`` conflicts with the test tools: keep it in a venv of its own)."""


def _command(given: str | None = None) -> str | None:
    """Return the ``langgraph`` command: ``given`` (or ``$RODER_BENCH_LANGGRAPH``), a
    command or a venv directory; else the one beside this Python; else on ``PATH``."""
    given = given or os.environ.get(LANGGRAPH_ENV)
    if given:
        path = Path(given).expanduser()
        if path.is_dir():
            path = path / "bin" / "langgraph"
        return str(path) if path.is_file() else None
    local = Path(sys.executable).with_name("langgraph")
    return str(local) if local.exists() else shutil.which("langgraph")


def measure(
    runs: int,
    samples: int,
    *,
    runs_per_second_of: Callable[[Callable[[str], None], list[str]], float],
    command: str | None = None,
) -> dict[str, Any]:
    """Return runs/s and the median time to first event of ``langgraph dev``, or a note.

    ``command``: the ``langgraph`` command or a venv that has it (default
    ``$RODER_BENCH_LANGGRAPH``, else beside this Python, else on ``PATH``)."""
    found = _command(command)
    if found is None:
        return {
            "note": "langgraph-cli[inmem] is not installed (give it a venv of its own, named "
            f"by --langgraph / ${LANGGRAPH_ENV}): skipped"
        }
    command = found
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "graph.py").write_text(GRAPH)
        (root / "langgraph.json").write_text(
            '{"dependencies": ["."], "graphs": {"echo": "./graph.py:graph"}}'
        )
        port = _free_port()
        env = {
            **os.environ,
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
        }
        proc = subprocess.Popen(
            [command, "dev", "--port", str(port), "--no-browser", "--no-reload"],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            if not _wait_up(url, proc):
                return {"note": "langgraph dev did not start: skipped"}
            return _measure(url, runs, samples, runs_per_second_of)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _wait_up(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/ok", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _measure(
    url: str,
    runs: int,
    samples: int,
    runs_per_second_of: Callable[[Callable[[str], None], list[str]], float],
) -> dict[str, Any]:
    # The same workloads as roder serve's: threads made before the clock starts; a run is
    # timed from its POST until its stream says it ended (``/runs/stream``, read to the end).
    body = {"assistant_id": "echo", "input": {"text": "hello there"}, "stream_mode": "values"}

    def one_run(tid: str) -> None:
        c = thread_client(url)  # kept open per client thread, as for roder serve
        with c.stream("POST", f"/threads/{tid}/runs/stream", json=body) as stream:
            assert stream.status_code == 200, stream.read()
            for _ in stream.iter_lines():
                pass

    with httpx.Client(base_url=url, timeout=60) as c:
        threads = [c.post("/threads", json={}).json()["thread_id"] for _ in range(runs)]
    rate = runs_per_second_of(one_run, threads)
    firsts: list[float] = []
    for _ in range(samples):
        with httpx.Client(base_url=url, timeout=60) as c:
            tid = c.post("/threads", json={}).json()["thread_id"]
            start = time.perf_counter()
            got = threading.Event()
            with c.stream("POST", f"/threads/{tid}/runs/stream", json=body) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event:") and not got.is_set():
                        firsts.append((time.perf_counter() - start) * 1000)
                        got.set()
    return {"runs_per_s": rate, "first_event_ms": statistics.median(firsts)}
