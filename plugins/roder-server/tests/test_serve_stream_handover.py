"""A stream waiting on the store for other processes' appends takes a local hand-over at
once: it never waits for its own store read (a poll behind a busy worker pool) to finish.

A real JSONL store in a real app (``create_app`` with its lifespan); the store's poll of a
thread's last sequence (``read_last_sequence``, what a stream's wait polls) is held in a
worker thread, as a read queued behind many session starts is."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from serve_support import stream_during, stream_sequences, two_stores, words
from starlette.testclient import TestClient

from roder_api.events import TurnComplete
from roder_runtime import Runtime
from roder_server import ServerSettings, create_app


def _hold_polls(store: Any, entered: threading.Event, gate: threading.Event) -> None:
    """Hold every poll of a thread's last sequence in a worker thread until ``gate`` opens
    (at most 60 s)."""
    original = store.read_last_sequence

    async def held(thread_id: str) -> int:
        entered.set()
        await anyio.to_thread.run_sync(gate.wait, 60)
        result: int = await original(thread_id)
        return result

    store.read_last_sequence = held


def test_a_waiting_stream_takes_a_hand_over_without_finishing_its_store_read(
    tmp_path: Path,
) -> None:
    runtime = Runtime.from_config(
        {"thread_store": {"backend": "jsonl", "path": str(tmp_path / "threads")}}
    )
    app = create_app(runtime, ServerSettings(heartbeat_s=30), tokens={})
    entered, gate = threading.Event(), threading.Event()
    got: list[bytes] = []
    try:
        with TestClient(app) as client:
            tid = client.post("/v1/threads", json={}).json()["thread_id"]
            assert client.portal is not None
            store = client.portal.call(runtime.store)
            _hold_polls(store, entered, gate)

            def read() -> None:
                got.append(client.get(f"/v1/threads/{tid}/stream?until=turn_end").content)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                assert entered.wait(30), "the stream never waited on the store"
                client.portal.call(store.append_events, tid, [*words(3), TurnComplete("t1")])
                reader.join(20)
                held = reader.is_alive()
            finally:
                gate.set()
                reader.join(60)
            assert not held, "the handed-over events waited for the stream's store read"
    finally:
        anyio.run(runtime.aclose)
    assert stream_sequences(got) == [1, 2, 3, 4]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_with_a_task_group_another_store_objects_appends_still_arrive_in_order(
    tmp_path: Path, anyio_backend: str
) -> None:
    async with two_stores(tmp_path) as (here, there):

        async def append() -> None:
            for i in range(30):
                # Appends here are handed over; there's are read (a gap, a poll).
                await (here if i % 3 else there).append_events("th", words(2, 2 * i))
                await anyio.sleep(0.3 if i % 5 == 0 else 0)  # quiet: the store waits
            await there.append_events("th", [TurnComplete("t1")])

        chunks = await stream_during(here, append)
    assert stream_sequences(chunks) == list(range(1, 62))
