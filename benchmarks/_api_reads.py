"""The public-API benchmark's read workloads: W3 (``load_thread``) and W4 (``replay_history``)."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from _api_common import (
    Sizes,
    interleaved,
    peer_available,
    peer_item,
    peer_session,
    raw_line,
    runtime_at,
    store_factory,
    user_item,
)
from _store_raw import raw_load, raw_tail  # the same raw reads as store_bench's

from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.transcript import ContextCompaction
from roder_runtime import Runtime, RuntimeConfig

# --- W3 / W4: reads of a long thread ----------------------------------------------------------


@dataclass
class LongThread:
    base: Path
    thread_id: str
    raw_path: Path
    peer_db: Path | None


async def long_thread(root: Path, items: int, *, boundary_from_end: int) -> LongThread:
    """Write a thread of ``items`` items, one line each as ``persist_turn_item`` writes them
    (a compaction boundary ``boundary_from_end`` items from the end), the same lines raw,
    and the same items into the peer. Roder's journal is written without syncs (it is
    only read afterwards)."""
    base = root / f"long-{items}"
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(store_factory(base, durability="none"))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        tid = (await runtime.create_thread(title="long")).thread_id
        cut = items - boundary_from_end
        for i in range(items):
            item = ContextCompaction("the summary so far") if i == cut else user_item(i)
            await runtime.persist_turn_item(tid, f"turn-{i // 4}", item)
    raw_path = root / f"long-{items}.jsonl"
    raw_path.write_bytes(b"".join(raw_line(i) for i in range(items)))  # noqa: ASYNC240 - setup
    peer_db = None
    if peer_available():
        peer_db = root / f"long-{items}-peer.db"
        with peer_session("long", peer_db) as session:
            for start in range(0, items, 1000):
                await session.add_items(
                    [peer_item(i) for i in range(start, min(items, start + 1000))]
                )
    return LongThread(base, tid, raw_path, peer_db)


async def w3(thread: LongThread, sizes: Sizes) -> dict[str, float | None]:
    async def roder() -> float:
        async with runtime_at(thread.base) as runtime:
            await runtime.load_thread(thread.thread_id)  # as a serving runtime would have
            gc.collect()
            start = time.perf_counter()
            snapshot = await runtime.load_thread(thread.thread_id)
            elapsed = time.perf_counter() - start
            assert snapshot is not None and len(snapshot.items) == sizes.w3_items
            return elapsed

    async def raw() -> float:
        start = time.perf_counter()
        raw_load(thread.raw_path)
        return time.perf_counter() - start

    peer_fn: Callable[[], Awaitable[float]] | None = None
    if thread.peer_db is not None:
        peer_db = thread.peer_db

        async def peer() -> float:
            with peer_session("long", peer_db) as session:
                start = time.perf_counter()
                got = await session.get_items()
                elapsed = time.perf_counter() - start
                assert len(got) == sizes.w3_items
                return elapsed

        peer_fn = peer
    roder_s, raw_s, peer_s = await interleaved(roder, raw, peer_fn, sizes.repeats)
    async with runtime_at(thread.base) as runtime:
        await runtime.store()
        roder_peak = await peak_memory(lambda: runtime.load_thread(thread.thread_id))

    async def raw_async() -> object:
        return raw_load(thread.raw_path)

    raw_peak = await peak_memory(raw_async)
    return {
        "raw": raw_s,
        "roder": roder_s,
        "peer": peer_s,
        "roder_peak_mb": roder_peak / 1e6,
        "raw_peak_mb": raw_peak / 1e6,
    }


async def peak_memory(func: Callable[[], Awaitable[object]]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        result = await func()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak


async def w4(thread: LongThread, sizes: Sizes) -> dict[str, float | None]:
    async def roder() -> float:
        async with runtime_at(thread.base) as runtime:
            # A runtime already serving: its store is open (a listing opened the index),
            # the thread itself was not read since.
            await runtime.list_threads(limit=1)
            start = time.perf_counter()
            items = await runtime.replay_history(thread.thread_id)
            elapsed = time.perf_counter() - start
            assert len(items) == 20, len(items)
            return elapsed

    async def raw() -> float:
        start = time.perf_counter()
        raw_tail(thread.raw_path)
        return time.perf_counter() - start

    peer_fn: Callable[[], Awaitable[float]] | None = None
    if thread.peer_db is not None:
        peer_db = thread.peer_db

        async def peer() -> float:
            with peer_session("long", peer_db) as session:
                start = time.perf_counter()
                got = await session.get_items(limit=20)
                elapsed = time.perf_counter() - start
                assert len(got) == 20
                return elapsed

        peer_fn = peer
    roder_s, raw_s, peer_s = await interleaved(roder, raw, peer_fn, sizes.repeats * 3)
    return {"raw": raw_s, "roder": roder_s, "peer": peer_s}


# --- W5: many small threads -------------------------------------------------------------------
