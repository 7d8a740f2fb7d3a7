"""A stream opened at the end of its thread does not read the journal before its first
event: the route's existence check already said there is nothing to read (one store read
fewer per stream, in a burst of runs that each open a stream before posting). An append
made between that check and the stream's subscription (by another store object) is still
read, in order."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio
import pytest
from serve_support import CountedReads, stream_during, stream_sequences, two_stores, words
from starlette.testclient import TestClient

from roder_api.events import TurnComplete
from roder_runtime import Runtime
from roder_server import ServerSettings, create_app


def test_a_stream_opened_at_the_end_sends_live_events_without_a_journal_read(
    tmp_path: Path,
) -> None:
    runtime = Runtime.from_config(
        {"thread_store": {"backend": "jsonl", "path": str(tmp_path / "threads")}}
    )
    app = create_app(runtime, ServerSettings(heartbeat_s=30), tokens={})
    got: list[bytes] = []
    try:
        with TestClient(app) as client:
            tid = client.post("/v1/threads", json={}).json()["thread_id"]
            assert client.portal is not None
            store = client.portal.call(runtime.store)
            client.portal.call(store.append_events, tid, words(2))
            reads = CountedReads(store).afters
            opened = threading.Event()

            def read() -> None:
                with client.stream("GET", f"/v1/threads/{tid}/stream?after=2&until=turn_end") as r:
                    for chunk in r.iter_bytes():
                        opened.set()
                        got.append(chunk)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            assert opened.wait(30), "the stream never opened"
            time.sleep(0.1)  # the stream is waiting (subscribed) by now
            client.portal.call(store.append_events, tid, [*words(3, 2), TurnComplete("t1")])
            reader.join(30)
            assert not reader.is_alive()
    finally:
        anyio.run(runtime.aclose)
    assert stream_sequences(got) == [3, 4, 5, 6]
    assert reads == [], "the stream read the journal though it was at its end"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_an_append_after_the_known_last_sequence_is_still_read(
    tmp_path: Path, anyio_backend: str
) -> None:
    async with two_stores(tmp_path) as (here, there):
        # The caller saw 0 events; another process appended 3 before the stream subscribed.
        await there.append_events("th", words(3))

        async def append() -> None:
            await anyio.sleep(0.05)
            await here.append_events("th", [*words(2, 3), TurnComplete("t1")])

        chunks = await stream_during(here, append, known_last=0)
    assert stream_sequences(chunks) == [1, 2, 3, 4, 5, 6]
