"""Runs are answered in the order they were accepted, whichever process accepts each: a
run posted after another run's 202 starts after it, also when the first went to a server
that does not hold the thread (it journals the input) and the second to the one that does
(its session is idle, and would start the second at once)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from serve_support import Server, journal, wait_for, wait_run

pytestmark = pytest.mark.slow

ROUNDS = 5


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_a_run_accepted_later_elsewhere_starts_later(
    serve: Callable[..., Server], tmp_path: Path, backend: str
) -> None:
    a = serve(backend)
    schema = None
    if backend == "postgres":
        schema = a.config.read_text().split('schema = "')[1].split('"')[0]
    home = tmp_path / "second"
    home.mkdir()
    b = serve(backend, schema=schema, home=home, store_home=tmp_path)
    order: list[str] = []
    with a.client() as ca, b.client() as cb:
        tid = ca.post("/v1/threads", json={}).json()["thread_id"]
        for n in range(ROUNDS):
            # A answers a run: its session holds the thread, idle, for a while after.
            first = ca.post(f"/v1/threads/{tid}/runs", json={"input": "hi", "turn_id": f"a{n}"})
            assert first.status_code == 202, first.text
            assert wait_run(ca, tid, f"a{n}")["status"] == "completed"
            wait_for(lambda: a.lease_holder_pid(tid) == a.worker_pids()[0], "A to hold it")
            # Then x through B (journaled there: A holds the thread), and after its 202, y
            # through A.
            x = cb.post(f"/v1/threads/{tid}/runs", json={"input": "x", "turn_id": f"x{n}"})
            assert x.status_code == 202, x.text
            y = ca.post(f"/v1/threads/{tid}/runs", json={"input": "y", "turn_id": f"y{n}"})
            assert y.status_code == 202, y.text
            for turn in (f"x{n}", f"y{n}"):
                assert wait_run(ca, tid, turn)["status"] == "completed"
            order += [f"a{n}", f"x{n}", f"y{n}"]
        started = [
            e["event"]["turn_id"] for e in journal(ca, tid) if e["event"]["type"] == "turn_started"
        ]
    assert started == order, "a run accepted later started first"
