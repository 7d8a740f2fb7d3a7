"""``--workers 4`` on JSONL and SQLite (2 on PostgreSQL): many concurrent runs on several
threads, posted on connections of their own (so through different workers), streams read
on others; then SIGKILL the one worker running a turn (the supervisor replaces it, the
server serves on: no restart); then another round and SIGKILL the whole server, and
restart. Every accepted run is answered or closed by the crash rules, once; every stream
(reconnecting from its Last-Event-ID) is gap-free, without a duplicate, in order, and equal
to the journal."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_support import (
    Server,
    StreamReader,
    check_stream,
    journal,
    wait_for,
    wait_run,
)

pytestmark = pytest.mark.slow

THREADS = 6
RUNS = 3
"""Runs posted to each thread per round (the first long, the others queued behind it)."""
LONG = " ".join(f"w{i}" for i in range(120))  # ~2.4 s at 20 ms a word
SHORT = " ".join(f"s{i}" for i in range(8))
CRASH_REASONS = {"process_exited", "closed"}
"""How the crash rules close a turn a dead process ran (never ``runtime_closed``: no worker
is stopped by its supervisor, the survivors of a worker's death serve on)."""
HEARTBEAT = "[server]\nheartbeat_s = 1\n"


def _post(url: str, thread_id: str, turn_id: str, text: str) -> tuple[str, str, int]:
    # A connection of its own: the listening socket hands it to any worker.
    try:
        with httpx.Client(base_url=url, timeout=30) as c:
            response = c.post(
                f"/v1/threads/{thread_id}/runs", json={"input": text, "turn_id": turn_id}
            )
        return thread_id, turn_id, response.status_code
    except httpx.HTTPError:
        return thread_id, turn_id, 0  # the server went away: not accepted


def _post_round(server: Server, threads: list[str], number: int) -> list[tuple[str, str]]:
    """Post RUNS runs to every thread at once, from several client threads; return the
    accepted (202) ones."""
    jobs = [
        (tid, f"round{number}-{tid}-{n}", LONG if n == 0 else SHORT)
        for n in range(RUNS)
        for tid in threads
    ]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: _post(server.url, *job), jobs))
    accepted = [(tid, turn) for tid, turn, status in results if status == 202]
    assert len(accepted) == len(jobs), [r for r in results if r[2] != 202]
    return accepted


def _running_turn(readers: dict[str, StreamReader]) -> str | None:
    """Return a thread whose turn is streaming now (started, some deltas, not ended)."""
    for tid, reader in readers.items():
        kinds = [m["event"] for m in reader.got]
        if "turn_started" not in kinds:
            continue
        tail = kinds[len(kinds) - kinds[::-1].index("turn_started") :]
        if tail.count("assistant_content_delta") >= 5 and not (
            {"turn_complete", "turn_aborted"} & set(tail)
        ):
            return tid
    return None


def _check_round(
    server: Server, readers: dict[str, StreamReader], accepted: list[tuple[str, str]]
) -> dict[str, int]:
    """Every accepted run starts and ends once (completed, or aborted by the crash rules),
    each stream equals its journal; return the counts."""
    counts = {"completed": 0, "aborted": 0}
    with server.client() as c:
        for tid, turn in accepted:
            status = wait_run(c, tid, turn, timeout_s=120)
            counts[status["status"]] += 1
            if status["status"] == "aborted":
                assert status.get("reason") in CRASH_REASONS, status
        for tid, reader in readers.items():
            events = journal(c, tid)
            kinds = [(e["event"]["type"], e["event"].get("turn_id")) for e in events]
            # A run is journaled as its InputAccepted (queued) or its TurnStarted (at once).
            inputs = list(
                dict.fromkeys(t for k, t in kinds if k in ("input_accepted", "turn_started"))
            )
            started = [t for k, t in kinds if k == "turn_started"]
            ended = [t for k, t in kinds if k in ("turn_complete", "turn_aborted")]
            # Each once (the order of runs accepted by different processes at nearly the
            # same moment: test_serve_run_order.py).
            assert sorted(started) == sorted(inputs), "an input was lost or answered twice"
            assert sorted(ended) == sorted(inputs), "a turn did not end exactly once"
            assert {t for x, t in accepted if x == tid} <= set(inputs), "an accepted run is lost"
            reader.wait_for_sequence(events[-1]["sequence"])
            check_stream(reader.got, events)
    return counts


def _kill_one_worker(server: Server, readers: dict[str, StreamReader], workers: int) -> int:
    """SIGKILL the worker holding a thread whose turn is streaming; return its pid."""
    pids = server.worker_pids()
    assert len(pids) == workers, f"workers: {pids}"
    holder: list[int] = []

    def found() -> bool:
        tid = _running_turn(readers)
        pid = server.lease_holder_pid(tid) if tid is not None else None
        if pid in pids:
            holder.append(pid)  # type: ignore[arg-type]
        return bool(holder)

    wait_for(found, "a turn streaming on a known worker", 60)
    os.kill(holder[0], signal.SIGKILL)
    return holder[0]


@pytest.mark.parametrize(("backend", "workers"), [("jsonl", 4), ("sqlite", 4), ("postgres", 2)])
def test_many_runs_on_many_workers_survive_a_worker_kill_and_a_server_kill(
    serve: Callable[..., Server], backend: str, workers: int
) -> None:
    server = serve(backend, args=("--workers", str(workers)), top=HEARTBEAT)
    with server.client() as c:
        threads = [c.post("/v1/threads", json={}).json()["thread_id"] for _ in range(THREADS)]
    readers = {tid: StreamReader(lambda: server.url, tid) for tid in threads}
    try:
        # Round 1: SIGKILL the worker running a turn; the supervisor replaces it and the
        # server serves on (no restart): the surviving workers and the replacement answer.
        accepted = _post_round(server, threads, 1)
        holders = {server.lease_holder_pid(tid) for tid in threads} - {None}
        assert len(holders) >= 2, f"the turns all ran in one process: {holders}"
        before = server.worker_pids()
        victim = _kill_one_worker(server, readers, workers)
        first = _check_round(server, readers, accepted)
        assert first["aborted"] >= 1, f"the killed worker {victim} ran no turn: {first}"
        assert server.proc is not None and server.proc.poll() is None, "the server stopped"
        wait_for(
            lambda: len(server.worker_pids()) == workers and victim not in server.worker_pids(),
            "the dead worker's replacement",
            60,
        )
        assert len(set(server.worker_pids()) - set(before)) == 1, "not one new worker"
        # Round 2: SIGKILL the whole server mid-run.
        accepted = _post_round(server, threads, 2)
        wait_for(lambda: _running_turn(readers) is not None, "a turn streaming", 60)
        holders |= {server.lease_holder_pid(tid) for tid in threads} - {None}
        server.kill()
        server.start()
        second = _check_round(server, readers, accepted)
        assert second["aborted"] >= 1, f"the server kill aborted nothing: {second}"
    finally:
        for reader in readers.values():
            reader.close()
    assert sum(r.connections for r in readers.values()) >= 2 * THREADS, "no stream resumed"
    print(f"\n{backend} x{workers}: holders {sorted(p for p in holders if p)}, {first}, {second}")
    assert server.stop() == 0
