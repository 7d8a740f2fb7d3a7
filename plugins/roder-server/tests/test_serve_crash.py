"""SIGKILL a server mid-run and mid-stream, restart it, resume the stream from Last-Event-ID:
nothing lost, duplicated or reordered (JSONL, SQLite, PostgreSQL); a client that
disconnects and reconnects 100 times during one run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from serve_support import Server, check_stream, collect, journal, kill_after_events, wait_run

pytestmark = pytest.mark.slow

LONG = " ".join(f"w{i}" for i in range(150))  # ~3 s at 20 ms a word


def _collect(
    server: Server, thread_id: str, got: list[dict[str, Any]], *, stop_after: int | None = None
) -> None:
    collect(server.url, thread_id, got, stop_after=stop_after)


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_sigkill_mid_run_and_mid_stream_then_resume(
    serve: Callable[..., Server], backend: str
) -> None:
    server = serve(backend)
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        run = c.post(f"/v1/threads/{tid}/runs", json={"input": LONG, "turn_id": "r1"})
        assert run.status_code == 202
        queued = c.post(f"/v1/threads/{tid}/runs", json={"input": "after", "turn_id": "r2"})
        assert queued.json()["status"] == "queued"
    got, reader = kill_after_events(server.url, tid, server.kill)  # mid-run, mid-stream
    reader.join(30)
    before = len(got)
    server.start()
    with server.client() as c:
        # The dead turn is closed by the crash rules; the accepted input is answered.
        assert wait_run(c, tid, "r1")["status"] == "aborted"
        assert wait_run(c, tid, "r2")["status"] == "completed"
        _collect(server, tid, got)  # resumes at Last-Event-ID: up to r1's end
        assert got[-1]["event"] == "turn_aborted"
        _collect(server, tid, got)  # and r2's turn
        assert got[-1]["event"] == "turn_complete"
        events = journal(c, tid)
    assert len(got) > before
    check_stream(got, events)
    assert len(got) == len(events)


def test_reconnect_100_times_during_one_run(serve: Callable[..., Server]) -> None:
    server = serve()
    words = " ".join(f"w{i}" for i in range(600))  # ~12 s at 20 ms a word
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        c.post(f"/v1/threads/{tid}/runs", json={"input": words, "turn_id": "r1"})
        got: list[dict[str, Any]] = []
        for _ in range(100):
            _collect(server, tid, got, stop_after=1)
            assert got[-1]["event"] not in ("turn_complete", "turn_aborted"), (
                "the run ended before the 100 reconnects: make it longer"
            )
        _collect(server, tid, got)
        assert got[-1]["event"] == "turn_complete"
        assert wait_run(c, tid, "r1")["status"] == "completed"
        events = journal(c, tid)
    check_stream(got, events)
    assert len(got) == len(events) >= 100


LONGER = " ".join(f"w{i}" for i in range(400))  # ~8 s at 20 ms a word: one event a word
KILL_AFTER_EVENTS = 150
"""More journaled events than any fixed tail a pick-up could read (the old one read 64)."""


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_sigkill_after_a_long_reply_then_restart_answers_the_queue(
    serve: Callable[..., Server], backend: str
) -> None:
    """Killed after >= 150 events of r1's reply, with r2 queued: the restarted server finds
    the thread by its store query (nobody holds it, nobody asks), closes r1 by the crash
    rules and answers r2."""
    server = serve(backend)
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        run = c.post(f"/v1/threads/{tid}/runs", json={"input": LONGER, "turn_id": "r1"})
        assert run.status_code == 202
        queued = c.post(f"/v1/threads/{tid}/runs", json={"input": "after", "turn_id": "r2"})
        assert queued.json()["status"] == "queued"
    got: list[dict[str, Any]] = []
    _collect(server, tid, got, stop_after=KILL_AFTER_EVENTS)  # streamed = journaled
    assert len(got) >= KILL_AFTER_EVENTS, "the stream did not deliver"
    assert got[-1]["event"] not in ("turn_complete", "turn_aborted"), "r1 ended too soon"
    server.kill()
    server.start()
    with server.client() as c:
        # Only status reads here (they open no session): the pick-up must find the thread.
        assert wait_run(c, tid, "r1", timeout_s=30)["status"] == "aborted"
        assert wait_run(c, tid, "r2", timeout_s=30)["status"] == "completed"
        events = journal(c, tid)
    assert len(events) > KILL_AFTER_EVENTS
    kinds = [e["event"]["type"] for e in events]
    assert kinds.count("turn_aborted") == 1 and kinds[-1] == "turn_complete", kinds[-5:]
