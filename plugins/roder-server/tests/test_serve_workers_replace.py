"""``--workers 2``: a worker that dies is replaced while the server keeps serving.

SIGKILL the worker holding a streaming turn (the OOM killer, a crash): the server lives on;
the run it held is closed by the crash rules and the input queued behind it is answered,
by the surviving worker's sweep or the replacement's start (the store's query of accepted
input nobody holds); the surviving worker's own turns run to their end untouched; a new
worker takes the dead one's place. And a worker that cannot start is not restarted forever:
the server stops, non-zero, saying why.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_support import (
    PREFIX,
    Server,
    StreamReader,
    check_stream,
    journal,
    serve_until_exit,
    wait_for,
    wait_run,
)

pytestmark = pytest.mark.slow

LONG = " ".join(f"w{i}" for i in range(300))  # ~6 s at 20 ms a word
SHORT = "a short answer"
CRASH_REASONS = {"process_exited"}
"""How the crash rules close the turn the dead worker ran (never ``runtime_closed``: that
is a worker stopped by its supervisor)."""


def _post(url: str, thread_id: str, text: str) -> tuple[str, str]:
    """Post a run on a connection of its own (so to either worker); return its
    ``(thread, turn)``."""
    turn_id = f"turn-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=url, timeout=30) as c:
        response = c.post(f"/v1/threads/{thread_id}/runs", json={"input": text, "turn_id": turn_id})
    assert response.status_code == 202, response.text
    return thread_id, turn_id


def _spread_long_runs(server: Server, pids: list[int]) -> dict[str, tuple[str, int]]:
    """Start long runs on fresh threads (each POST on a connection of its own, so through
    either worker) until both workers hold one; return ``{thread: (turn, holder pid)}``."""
    held: dict[str, tuple[str, int]] = {}
    with server.client() as c:
        for _ in range(4):
            threads = [c.post("/v1/threads", json={}).json()["thread_id"] for _ in range(4)]
            with ThreadPoolExecutor(4) as pool:
                posted = list(pool.map(lambda t: _post(server.url, t, LONG), threads))
            for thread_id, turn_id in posted:
                pid = server.lease_holder_pid(thread_id)
                if pid in pids:
                    held[thread_id] = (turn_id, pid)
            if {pid for _, pid in held.values()} == set(pids):
                return held
    raise AssertionError(f"the long runs all ran in one worker: {held}")


def _streaming(reader: StreamReader, deltas: int = 5) -> bool:
    kinds = [m["event"] for m in reader.got]
    assert "turn_complete" not in kinds, "the long turn ended before the kill"
    return "turn_started" in kinds and kinds.count("assistant_content_delta") >= deltas


@pytest.mark.parametrize("backend", ["jsonl", "postgres"])
def test_a_killed_worker_is_replaced_and_the_server_lives(
    serve: Callable[..., Server], backend: str
) -> None:
    schema = f"roder_serve_workers_{uuid.uuid4().hex[:8]}" if backend == "postgres" else None
    server = serve(backend, args=("--workers", "2"), schema=schema)
    assert server.proc is not None
    first = server.worker_pids()
    assert len(first) == 2, first
    held = _spread_long_runs(server, first)
    victim_thread = next(iter(held))
    victim = held[victim_thread][1]
    survivors = {t: turn for t, (turn, pid) in held.items() if pid != victim}
    # Input accepted behind the victim's running turn: nobody answers it once it dies.
    _, queued = _post(server.url, victim_thread, SHORT)
    readers = {t: StreamReader(lambda: server.url, t) for t in held}
    try:
        wait_for(lambda: _streaming(readers[victim_thread]), "the victim's turn streaming", 60)
        killed_ms = int(time.time() * 1000)
        os.kill(victim, signal.SIGKILL)
        with server.client() as c:
            status = wait_run(c, victim_thread, held[victim_thread][0], timeout_s=120)
            assert status["status"] == "aborted", status
            assert status.get("reason") in CRASH_REASONS, status
            assert wait_run(c, victim_thread, queued, timeout_s=120)["status"] == "completed"
            aborted = [
                e
                for e in journal(c, victim_thread)
                if e["event"]["type"] == "turn_aborted"
                and e["event"]["turn_id"] == held[victim_thread][0]
            ]
            answered_s = (aborted[0]["recorded_at_ms"] - killed_ms) / 1000
            # The surviving worker's turns are not disturbed: each completes.
            for thread_id, turn_id in survivors.items():
                assert wait_run(c, thread_id, turn_id, timeout_s=120)["status"] == "completed"
            # The other runs the dead worker had started are closed by the crash rules too.
            for thread_id, (turn_id, pid) in held.items():
                end = wait_run(c, thread_id, turn_id, timeout_s=120)
                if pid == victim:
                    assert end["status"] == "completed" or end.get("reason") in CRASH_REASONS
            # A new worker took the dead one's place; the server never stopped.
            wait_for(
                lambda: len(server.worker_pids()) == 2 and victim not in server.worker_pids(),
                "a new worker",
                60,
            )
            assert server.proc.poll() is None, "the server stopped"
            replaced = set(server.worker_pids()) - set(first)
            assert len(replaced) == 1, (first, server.worker_pids())
            # Later runs are served, on the victim's thread and on a fresh one.
            fresh = c.post("/v1/threads", json={}).json()["thread_id"]
            later = [_post(server.url, t, SHORT) for t in (victim_thread, fresh)]
            for thread_id, turn_id in later:
                assert wait_run(c, thread_id, turn_id, timeout_s=120)["status"] == "completed"
            for thread_id, reader in readers.items():
                events = journal(c, thread_id)
                reader.wait_for_sequence(events[-1]["sequence"])
                check_stream(reader.got, events)
    finally:
        for reader in readers.values():
            reader.close()
    said = "".join(server.stderr)
    assert f"worker {victim} died (signal SIGKILL)" in said, said
    print(f"\n{backend}: the dead worker's turn was closed {answered_s:.2f} s after its SIGKILL")
    workers = server.worker_pids()
    # A clean stop (SIGTERM to the supervisor) still stops every worker, the new one too.
    assert server.stop() == 0
    assert [pid for pid in workers if Path(f"/proc/{pid}").exists()] == [], workers


def test_a_worker_that_cannot_start_stops_the_server(tmp_path: Path) -> None:
    pytest.importorskip("temporalio")
    # Each worker connects to the Temporal service at start: none answers on port 1.
    config = tmp_path / "config.toml"
    config.write_text(
        f'[thread_store]\nbackend = "jsonl"\npath = "{tmp_path / "threads"}"\n'
        '[temporal]\naddress = "127.0.0.1:1"\n'
    )
    code, err = serve_until_exit(
        config, tmp_path / "home", "--workers", "2", "--dispatch", "temporal", timeout_s=180
    )
    assert code is not None, f"the server went on restarting workers that fail: {err}"
    assert code != 0, err
    assert PREFIX not in err, "the server said it listens, but no worker ever served"
    assert "exited before it served" in err, err
    assert "stopping" in err, err
