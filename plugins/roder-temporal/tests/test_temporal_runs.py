"""Runs through a real Temporal dev server: a run completes and streams; two workers on one
PostgreSQL store, SIGKILL the one running a turn (mid-stream, mid-tool, at an approval)
and the other finishes it: no accepted run lost, the non-idempotent tool never run twice,
the stream gap-free for a client that reconnects. Prints the failover time."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_support import (
    DEFAULT_TEST_DSN,
    Server,
    check_stream,
    collect,
    drop_schemas,
    journal,
    kill_after_events,
    wait_for,
    wait_run,
)
from serve_support import store_table as store_table_of
from temporal_support import WorkerProcess, tool_env

pytestmark = pytest.mark.slow

HEARTBEAT_S = 3
LONG = " ".join(f"w{i}" for i in range(300))  # ~6 s at 20 ms a word


def _config(address: str, *, worker: bool, extra: str = "") -> str:
    return (
        '[server]\ndispatch = "temporal"\n'
        f'[temporal]\naddress = "{address}"\ntask_queue = "q-{uuid.uuid4().hex[:8]}"\n'
        f"heartbeat_timeout_s = {HEARTBEAT_S}\nworker = {'true' if worker else 'false'}\n" + extra
    )


def _collect(url: str, thread_id: str, got: list[dict[str, Any]], stop_after: int = 0) -> None:
    """Read the stream from the last id in ``got`` until turn end (or ``stop_after``)."""
    collect(url, thread_id, got, stop_after=stop_after or None, read_s=60)


def test_a_run_through_temporal_completes_and_streams(
    temporal_address: str, tmp_path: Path
) -> None:
    server = Server(
        tmp_path,
        store_table_of("jsonl", tmp_path, "", None),
        extra_config=_config(temporal_address, worker=True),
        env={},
    )
    server.start()
    try:
        with server.client() as c:
            tid = c.post("/v1/threads", json={}).json()["thread_id"]
            run = c.post(f"/v1/threads/{tid}/runs", json={"input": "one two three"})
            assert run.status_code == 202, run.text
            turn = run.json()["turn_id"]
            got: list[dict[str, Any]] = []
            _collect(server.url, tid, got)
            assert got[-1]["event"] == "turn_complete"
            assert wait_run(c, tid, turn)["status"] == "completed"
            check_stream(got, journal(c, tid))
    finally:
        server.stop()  # (uvicorn re-raises SIGTERM after its graceful shutdown)


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Return ``(dsn, schema)`` of a fresh schema, dropped afterwards."""
    dsn = os.environ.get("RODER_TEST_POSTGRES_DSN") or DEFAULT_TEST_DSN
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any reason it cannot be used: skip
        pytest.skip(f"PostgreSQL is not reachable: {str(exc).strip().splitlines()[0]}")
    schema = f"roder_temporal_{uuid.uuid4().hex[:10]}"
    yield dsn, schema
    drop_schemas(dsn, [schema])


CALL = 'call effect {"label": "once"}'


@pytest.mark.parametrize("moment", ["mid_stream", "mid_tool", "at_approval"])
def test_sigkill_the_worker_running_a_turn_the_other_finishes_it(
    temporal_address: str, tmp_path: Path, postgres: tuple[str, str], moment: str
) -> None:
    dsn, schema = postgres
    effects = tmp_path / "effects.txt"
    effects.touch()
    env = tool_env(tmp_path, effects, effect_s=30 if moment == "mid_tool" else 0)
    ask = '[tools.approval]\neffect = "ask"\n' if moment == "at_approval" else ""
    server = Server(
        tmp_path,
        store_table_of("postgres", tmp_path, dsn, schema),
        extra_config=_config(temporal_address, worker=False, extra=ask),
        env=env,
    )
    server.start()
    workers = [WorkerProcess(server.config, server.env) for _ in range(2)]
    try:
        for worker in workers:
            assert worker.up.wait(60) and worker.proc.poll() is None, worker.lines
        with server.client() as c:
            tid = c.post("/v1/threads", json={}).json()["thread_id"]
            first = LONG if moment == "mid_stream" else CALL
            assert c.post(f"/v1/threads/{tid}/runs", json={"input": first, "turn_id": "r1"})
            queued = c.post(f"/v1/threads/{tid}/runs", json={"input": "after", "turn_id": "r2"})
            assert queued.status_code == 202, queued.text
            killed_at = 0.0

            def kill_the_holder() -> None:
                nonlocal killed_at
                wait_for(lambda: any(w.answering(tid) for w in workers), "a worker to take it")
                if moment == "mid_tool":
                    wait_for(lambda: effects.read_text().count("\n") == 1, "the tool to start")
                elif moment == "at_approval":
                    wait_for(lambda: _asked(c, tid) == 1, "the approval request")
                killed_at = time.monotonic()
                next(w for w in workers if w.answering(tid)).kill()

            # Mid-stream: after 10 streamed events; else at the tool or approval (the
            # stream has delivered r1's start by then).
            got, reader = kill_after_events(
                server.url, tid, kill_the_holder, events=10 if moment == "mid_stream" else 1
            )
            holder = next(w for w in workers if w.answering(tid))
            other = next(w for w in workers if w is not holder)
            last = journal(c, tid)[-1]["sequence"]  # the dead worker writes no more
            wait_for(lambda: journal(c, tid)[-1]["sequence"] > last, "the other worker", 60)
            failover = time.monotonic() - killed_at
            print(f"\nfailover ({moment}): {failover:.2f} s (heartbeat timeout {HEARTBEAT_S} s)")
            wait_for(lambda: other.answering(tid), "the other worker to say it took the run", 10)
            if moment == "at_approval":
                wait_for(lambda: _asked(c, tid) == 2, "the approval to be asked again")
                call_id = _last_asked(c, tid)
                answer = c.post(f"/v1/threads/{tid}/approvals/{call_id}", json={"approved": True})
                assert answer.status_code == 202, answer.text
            r1 = wait_run(c, tid, "r1", timeout_s=90)
            assert wait_run(c, tid, "r2", timeout_s=90)["status"] == "completed"
            reader.join(60)
            # The client reconnects (Last-Event-ID) until it has seen r2's end too.
            while not got or got[-1]["event"] != "turn_complete" or _ends(got) < 2:
                _collect(server.url, tid, got)
            events = journal(c, tid)
        check_stream(got, events)
        assert len(got) == len(events)
        runs = [e["event"]["turn_id"] for e in events if e["event"]["type"] == "turn_started"]
        assert runs == ["r1", "r2"], "an accepted run was lost or answered twice"
        if moment == "mid_stream":
            # The crash rules, not Temporal, close a turn that died mid-stream.
            assert r1 == {**r1, "status": "aborted", "reason": "process_exited"}
        else:
            assert r1["status"] == "completed"
        ran = effects.read_text().splitlines()
        if moment == "mid_stream":
            assert ran == []
        else:
            assert len(ran) == 1, f"the non-idempotent tool ran {len(ran)} times: {ran}"
        if moment == "mid_tool":
            results = [
                e["event"]["item"]
                for e in events
                if e["event"]["type"] == "item_completed"
                and e["event"]["item"]["type"] == "tool_result"
            ]
            assert len(results) == 1 and results[0]["is_error"], results
    finally:
        for worker in workers:
            worker.stop()
        server.stop()


def _asked(c: httpx.Client, thread_id: str) -> int:
    return sum(1 for e in journal(c, thread_id) if e["event"]["type"] == "tool_approval_requested")


def _last_asked(c: httpx.Client, thread_id: str) -> str:
    asked = [e for e in journal(c, thread_id) if e["event"]["type"] == "tool_approval_requested"]
    return str(asked[-1]["event"]["call_id"])


def _ends(got: list[dict[str, Any]]) -> int:
    return sum(1 for m in got if m["event"] in ("turn_complete", "turn_aborted"))
