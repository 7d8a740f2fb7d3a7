"""Several processes on one store: ``--workers 2``, and two servers on one PostgreSQL.

Every process accepts runs and serves streams for every thread; the turns of a thread run
where its lease is held, and input accepted elsewhere is answered there, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from serve_support import Server, journal, read_sse, wait_run

pytestmark = pytest.mark.slow


def _stream_all(url: str, thread_id: str, turns: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    ended = 0
    with httpx.stream(
        "GET", f"{url}/v1/threads/{thread_id}/stream", params={"after": 0}, timeout=60
    ) as response:
        for message in read_sse(response):
            if "id" in message:
                got.append(message)
                if message["event"] in ("turn_complete", "turn_aborted"):
                    ended += 1
                    if ended == turns:
                        return got
    return got


def _runs_on_many_processes(urls: list[str]) -> None:
    with httpx.Client(base_url=urls[0], timeout=30) as first:
        threads = [first.post("/v1/threads", json={}).json()["thread_id"] for _ in range(3)]
    turns: dict[str, list[str]] = {t: [] for t in threads}
    for n in range(4):
        # Every process takes runs for every thread: most find the lease held elsewhere.
        for index, thread_id in enumerate(threads):
            with httpx.Client(base_url=urls[(n + index) % len(urls)], timeout=30) as c:
                run = c.post(f"/v1/threads/{thread_id}/runs", json={"input": f"input {n} w w w w"})
                assert run.status_code == 202, run.text
                turns[thread_id].append(run.json()["turn_id"])
    for index, thread_id in enumerate(threads):
        with httpx.Client(base_url=urls[index % len(urls)], timeout=30) as c:
            for turn_id in turns[thread_id]:
                assert wait_run(c, thread_id, turn_id, timeout_s=90)["status"] == "completed"
            events = journal(c, thread_id)
        streamed = _stream_all(urls[(index + 1) % len(urls)], thread_id, len(turns[thread_id]))
        assert [int(m["id"]) for m in streamed] == [e["sequence"] for e in events]
        started = [e["event"]["turn_id"] for e in events if e["event"]["type"] == "turn_started"]
        assert started == turns[thread_id], "inputs were not answered once each, in order"


def test_two_workers_on_one_store(serve: Callable[..., Server]) -> None:
    server = serve("sqlite", args=("--workers", "2"))
    _runs_on_many_processes([server.url])
    assert server.stop() == 0


def test_two_servers_on_one_postgres(serve: Callable[..., Server], tmp_path: Any) -> None:
    first = serve("postgres")
    schema = first.config.read_text().split('schema = "')[1].split('"')[0]
    second_home = tmp_path / "second"
    second_home.mkdir()
    second = serve("postgres", schema=schema, home=second_home)
    _runs_on_many_processes([first.url, second.url])
