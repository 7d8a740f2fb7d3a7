"""The stream's in-process fan-out: live events handed over without a store read per stream,
and still no gap, duplicate or reorder when appends come from elsewhere or a stream falls
behind (real JSONL stores on disk; a second store object on the same directory stands for
another process)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import orjson
import pytest
from serve_support import CountedReads

from roder_api.events import AssistantContentDelta, ContentPhase, TurnComplete
from roder_api.threads import ThreadMetadata
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_server import journal_stream
from roder_server._stream import QUEUE_LIMIT

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every test under asyncio and under trio."""
    return str(request.param)


def _sequences(chunks: Sequence[bytes]) -> list[int]:
    found = []
    for message in b"".join(chunks).split(b"\n\n"):
        if message.startswith(b"id: "):
            data = message.split(b"\ndata: ", 1)[1]
            entry = orjson.loads(data)
            assert int(message[4 : message.index(b"\n")]) == entry["sequence"]
            found.append(entry["sequence"])
    return found


async def _collect(
    stream: AsyncIterator[bytes], into: list[bytes], seen: anyio.Event | None = None
) -> None:
    async for chunk in stream:
        into.append(chunk)
        if seen is not None and b"id: 3\n" in chunk:
            seen.set()


def _thread() -> ThreadMetadata:
    now = int(time.time() * 1000)
    return ThreadMetadata("th", now, now)


def _words(count: int, first: int = 0) -> list[AssistantContentDelta]:
    return [
        AssistantContentDelta("t1", "s1", ContentPhase.FINAL_ANSWER, f"w{first + i} ")
        for i in range(count)
    ]


async def test_the_stream_gets_live_events_without_reading_the_store(tmp_path: Path) -> None:
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        await store.append_events("th", _words(3))
        counted = CountedReads(store)
        chunks: list[bytes] = []
        stream = journal_stream(store, "th", 0, heartbeat_s=30, until_turn_end=True)
        async with anyio.create_task_group() as tg:
            caught_up = anyio.Event()
            tg.start_soon(_collect, stream, chunks, caught_up)
            with anyio.fail_after(30):
                await caught_up.wait()  # the catch-up read sent the journal
            reads_before_live = counted.reads
            for i in range(20):
                await store.append_events("th", _words(1, 100 + i))
                await anyio.lowlevel.checkpoint()
            await store.append_events("th", [TurnComplete("t1")])
        assert _sequences(chunks) == list(range(1, 25))
        # Live events were handed over in memory: no read per event (main read per wake).
        assert counted.reads - reads_before_live <= 2
    finally:
        await store.aclose()


async def test_appends_by_another_store_object_are_read_in_order(tmp_path: Path) -> None:
    here = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    there = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await here.create_thread(_thread())
        chunks: list[bytes] = []
        stream = journal_stream(here, "th", 0, heartbeat_s=30, until_turn_end=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect, stream, chunks)
            with anyio.fail_after(60):
                for i in range(30):
                    # Interleaved: appends here are handed over; there's are not (a gap).
                    await (here if i % 3 else there).append_events("th", _words(2, 2 * i))
                    if i % 5 == 0:
                        await anyio.sleep(0.02)
                await there.append_events("th", [TurnComplete("t1")])
        assert _sequences(chunks) == list(range(1, 62))
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_stream_that_falls_behind_reads_back_what_it_dropped(tmp_path: Path) -> None:
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        stream = journal_stream(store, "th", 0, heartbeat_s=30, until_turn_end=True)
        chunks = [await stream.__anext__()]  # `retry:`; subscribed once the next is asked
        with anyio.fail_after(60):
            # Its client does not read while more than its queue holds is appended.
            first = stream.__anext__()
            async with anyio.create_task_group() as tg:

                async def take_first() -> None:
                    chunks.append(await first)

                tg.start_soon(take_first)
                await anyio.sleep(0.05)
                for i in range(0, QUEUE_LIMIT + 300, 100):
                    await store.append_events("th", _words(100, i))
            await store.append_events("th", [TurnComplete("t1")])
            async for chunk in stream:
                chunks.append(chunk)
        total = (QUEUE_LIMIT + 300 + 99) // 100 * 100 + 1
        assert _sequences(chunks) == list(range(1, total + 1))
    finally:
        await store.aclose()


async def test_many_streams_on_one_thread_each_get_every_event_once(tmp_path: Path) -> None:
    store = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        await store.create_thread(_thread())
        await store.append_events("th", _words(5))
        results: list[list[bytes]] = [[] for _ in range(10)]
        async with anyio.create_task_group() as tg:
            for i, into in enumerate(results):
                # Streams join at different points (after = 0..4) while events arrive.
                stream = journal_stream(store, "th", i % 5, heartbeat_s=30, until_turn_end=True)
                tg.start_soon(_collect, stream, into)
                await store.append_events("th", _words(3, 10 * i))
            await store.append_events("th", [TurnComplete("t1")])
        total = 5 + 3 * 10 + 1
        for i, into in enumerate(results):
            assert _sequences(into) == list(range(i % 5 + 1, total + 1))
    finally:
        await store.aclose()
