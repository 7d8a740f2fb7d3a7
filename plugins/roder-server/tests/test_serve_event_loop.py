"""``roder serve`` runs on uvloop's event loop (``Command(loop="uvloop")``), every worker
process too, and on asyncio's when ``RODER_EVENT_LOOP=asyncio`` says so.

Seen from outside, in ``/proc/PID/maps``: uvloop's extension is loaded only when anyio is
asked to run on it (nothing else in the server imports it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from serve_support import Server, store_table, wait_run

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/maps")


def _on_uvloop(pid: int) -> bool:
    return "/uvloop/" in Path(f"/proc/{pid}/maps").read_text()


def _serve(tmp_path: Path, env: dict[str, str], workers: int) -> Server:
    return Server(
        tmp_path,
        store_table("jsonl", tmp_path, "", None),
        args=("--workers", str(workers)),
        env=env,
    )


def test_every_worker_runs_on_uvloop_and_answers(tmp_path: Path) -> None:
    server = _serve(tmp_path, {}, workers=2)
    server.start()
    try:
        pids = server.worker_pids()
        assert len(pids) == 2 and all(_on_uvloop(pid) for pid in pids), pids
        with httpx.Client(base_url=server.url, timeout=30) as client:
            thread_id = client.post("/v1/threads", json={}).json()["thread_id"]
            run = client.post(f"/v1/threads/{thread_id}/runs", json={"input": "hello"})
            assert run.status_code == 202, run.text
            done = wait_run(client, thread_id, run.json()["turn_id"])
            assert done["status"] == "completed"
    finally:
        server.stop()


def test_roder_event_loop_asyncio_keeps_asyncio(tmp_path: Path) -> None:
    server = _serve(tmp_path, {"RODER_EVENT_LOOP": "asyncio"}, workers=1)
    server.start()
    try:
        assert server.proc is not None and not _on_uvloop(server.proc.pid)
    finally:
        server.stop()
