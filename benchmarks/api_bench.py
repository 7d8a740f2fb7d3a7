"""Benchmark the public ``Runtime`` API where users feel it, next to raw baselines and a peer.

Five workloads (issue 13), each measured in the same run three ways: through Roder's public
``Runtime`` API on the JSONL store with its default durability, as the raw file operation
that bounds it, and with the OpenAI Agents SDK's ``SQLiteSession`` (the store most users
would pick instead; PyPI ``openai-agents``, a benchmark-only dependency: ``pip install
-e '.[bench]'``; its column is skipped with a note when it is not installed). Items are
user messages of about 400 bytes.

- W1: ``persist_turn_item`` one at a time. Raw: ``write`` + ``fdatasync`` per item. Peer:
  ``add_items([item])`` per item. An (info) row: the raw loop with each append handed to a
  writer thread and awaited (the least any store pays that keeps blocking I/O off the loop).
- W2: 50 concurrent ``persist_turn_item`` calls to one thread, every one durable before it
  returns. Raw: 50 writes and one ``fdatasync``. Peer: ``add_items`` of 50 items (its batch
  API). The target compares with W1's raw rate (a sync per append).
- W3: ``load_thread`` of a 50,000-item thread on a runtime opened just before (outside the
  timing). Raw: read the file and ``orjson.loads`` each line. Peer: ``get_items()`` on a
  fresh session. Peak memory (tracemalloc) of Roder and raw, measured apart.
- W4: ``replay_history`` of a 50,000-item thread whose last compaction boundary is 20
  items from the end, on a runtime opened just before (its store's index opened by a
  listing, the thread not read since). Raw: read the last 20 lines. Peer:
  ``get_items(limit=20)``.
- W5: 1,000 × ``create_thread`` with 10 items each (``persist_turn_items``). Raw: create a
  file, write 10 lines, ``fdatasync``, close. Peer: a session per thread, ``add_items`` of
  10 items. An (info) row: the file operations of a durable create and first append (the
  first line synced in a temporary file, linked, the directory synced, the append synced)
  in a plain loop.

Rates are items (or threads) per second from the median of the repeats; ratios are
Roder / raw in the direction of the target. Prints a table; ``--json PATH`` writes the
numbers; ``--quick`` runs small sizes in well under 30 s (CI's smoke test).
Run: ``python benchmarks/api_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio  # SQLiteSession (the peer) runs on asyncio only
import gc
import importlib.util
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from roder_api.events import ItemCompleted
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.transcript import ContextCompaction, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)

TEXT = "lorem ipsum dolor sit amet " * 13  # about 400 bytes per item as stored


@dataclass(frozen=True)
class Sizes:
    w1_items: int
    w2_tasks: int
    w2_rounds: int
    w3_items: int
    w5_threads: int
    repeats: int


FULL = Sizes(w1_items=1000, w2_tasks=50, w2_rounds=20, w3_items=50_000, w5_threads=1000, repeats=5)
QUICK = Sizes(w1_items=60, w2_tasks=50, w2_rounds=3, w3_items=1000, w5_threads=20, repeats=3)


def user_item(index: int) -> UserMessage:
    return UserMessage(f"{index} {TEXT}")


def peer_item(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"{index} {TEXT}"}


def raw_line(index: int) -> bytes:
    return orjson.dumps({"type": "user_message", "text": f"{index} {TEXT}"}) + b"\n"


def peer_available() -> bool:
    return importlib.util.find_spec("agents") is not None


async def interleaved(
    roder: Callable[[], Awaitable[float]],
    raw: Callable[[], Awaitable[float]],
    peer: Callable[[], Awaitable[float]] | None,
    repeats: int,
    extra: dict[str, Callable[[], Awaitable[float]]] | None = None,
    extra_out: dict[str, float] | None = None,
) -> tuple[float, float, float | None]:
    """Return the median seconds of Roder, raw and the peer, their rounds interleaved so
    that all three see the same disk weather (other jobs share this machine's disk).

    ``extra``: more baselines run in the same rounds; their medians go into ``extra_out``."""
    times: tuple[list[float], list[float], list[float]] = ([], [], [])
    more: dict[str, list[float]] = {name: [] for name in extra or {}}
    for _ in range(repeats):
        for func, out in ((roder, times[0]), (raw, times[1]), (peer, times[2])):
            if func is not None:
                gc.collect()
                out.append(await func())
        for name, func in (extra or {}).items():
            gc.collect()
            more[name].append(await func())
    if extra_out is not None:
        extra_out.update({name: statistics.median(values) for name, values in more.items()})
    peer_s = statistics.median(times[2]) if times[2] else None
    return statistics.median(times[0]), statistics.median(times[1]), peer_s


async def timed(func: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await func()
    return time.perf_counter() - start


DURABILITY: str | None = None
"""The JSONL durability to measure (``--durability``); None: the store's default."""


def jsonl_factory(base: Path) -> JsonlThreadStoreFactory:
    if DURABILITY is None:
        return JsonlThreadStoreFactory(base)
    return JsonlThreadStoreFactory(base, durability=DURABILITY)


@asynccontextmanager
async def runtime_at(base: Path) -> Any:
    """Yield a Runtime on a JSONL store at ``base`` (default durability unless asked)."""
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(jsonl_factory(base))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        await runtime.store()
        yield runtime


async def persist_many(runtime: Runtime, thread_id: str, items: list[UserMessage]) -> None:
    """Persist ``items`` as one batch: ``persist_turn_items`` where it exists."""
    batch = getattr(runtime, "persist_turn_items", None)
    if batch is not None:
        await batch(thread_id, "turn-1", items)
    else:
        await runtime.append_events(thread_id, [ItemCompleted("turn-1", i) for i in items])


@contextmanager
def peer_session(session_id: str, db: Path) -> Iterator[Any]:
    from agents import SQLiteSession

    session = SQLiteSession(session_id, db)
    try:
        yield session
    finally:
        session.close()


# --- W1 / W2: durable appends -----------------------------------------------------------------


async def raw_appends_via_a_thread(path: Path, n: int) -> float:
    """``write`` + ``fdatasync`` per item, each handed to one writer thread and awaited: the
    least a durable append costs when blocking I/O stays off the event loop (a queue to the
    thread, ``call_soon_threadsafe`` back), with no store work at all."""
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]] | None] = queue.SimpleQueue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def writer() -> None:
        while (job := jobs.get()) is not None:
            os.write(fd, job[0])
            _datasync(fd)
            loop.call_soon_threadsafe(job[1].set_result, None)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        start = time.perf_counter()
        for i in range(n):
            done: asyncio.Future[None] = loop.create_future()
            jobs.put((raw_line(i), done))
            await done
        return time.perf_counter() - start
    finally:
        jobs.put(None)
        thread.join()
        os.close(fd)
        os.unlink(path)


async def w1(root: Path, sizes: Sizes) -> dict[str, float | None]:
    n = sizes.w1_items

    async def raw() -> float:
        path = root / f"w1-{time.monotonic_ns()}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            start = time.perf_counter()
            for i in range(n):
                os.write(fd, raw_line(i))
                _datasync(fd)
            return time.perf_counter() - start
        finally:
            os.close(fd)
            path.unlink()

    async def peer() -> float:
        with peer_session(f"s{time.monotonic_ns()}", root / "w1-peer.db") as session:
            start = time.perf_counter()
            for i in range(n):
                await session.add_items([peer_item(i)])
            return time.perf_counter() - start

    async with runtime_at(root / "w1-roder") as runtime:

        async def roder() -> float:
            tid = (await runtime.create_thread()).thread_id
            start = time.perf_counter()
            for i in range(n):
                await runtime.persist_turn_item(tid, "turn-1", user_item(i))
            return time.perf_counter() - start

        async def hop() -> float:
            return await raw_appends_via_a_thread(root / f"w1-hop-{time.monotonic_ns()}", n)

        extra: dict[str, float] = {}
        roder_s, raw_s, peer_s = await interleaved(
            roder, raw, peer if peer_available() else None, sizes.repeats, {"hop": hop}, extra
        )
    return {
        "raw": n / raw_s,
        "roder": n / roder_s,
        "peer": None if peer_s is None else n / peer_s,
        "raw_via_thread": n / extra["hop"],
    }


async def w2(root: Path, sizes: Sizes) -> dict[str, float | None]:
    tasks, rounds = sizes.w2_tasks, sizes.w2_rounds
    total = tasks * rounds

    async def raw() -> float:
        path = root / f"w2-{time.monotonic_ns()}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            start = time.perf_counter()
            for _ in range(rounds):
                os.write(fd, b"".join(raw_line(i) for i in range(tasks)))
                _datasync(fd)
            return time.perf_counter() - start
        finally:
            os.close(fd)
            path.unlink()

    async def peer() -> float:
        with peer_session(f"s{time.monotonic_ns()}", root / "w2-peer.db") as session:
            start = time.perf_counter()
            for _ in range(rounds):
                await session.add_items([peer_item(i) for i in range(tasks)])
            return time.perf_counter() - start

    async with runtime_at(root / "w2-roder") as runtime:

        async def roder() -> float:
            tid = (await runtime.create_thread()).thread_id
            start = time.perf_counter()
            for _ in range(rounds):
                await asyncio.gather(
                    *(runtime.persist_turn_item(tid, "turn-1", user_item(i)) for i in range(tasks))
                )
            return time.perf_counter() - start

        roder_s, raw_s, peer_s = await interleaved(
            roder, raw, peer if peer_available() else None, sizes.repeats
        )
    return {
        "raw": total / raw_s,
        "roder": total / roder_s,
        "peer": None if peer_s is None else total / peer_s,
    }


# --- W3 / W4: reads of a long thread ----------------------------------------------------------


def raw_load(path: Path) -> list[Any]:
    with open(path, "rb") as file:
        return [orjson.loads(line) for line in file]


def raw_tail(path: Path, lines: int = 20) -> list[Any]:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        chunk = 1 << 14
        while True:
            file.seek(max(0, size - chunk))
            parts = file.read().split(b"\n")
            if len(parts) > lines + 1 or chunk >= size:
                break
            chunk *= 2
    return [orjson.loads(line) for line in parts[-lines - 1 : -1]]


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
    builder.thread_store_factory(JsonlThreadStoreFactory(base, durability="none"))
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


async def w5(root: Path, sizes: Sizes) -> dict[str, float | None]:
    n = sizes.w5_threads

    async def raw() -> float:
        directory = root / f"w5-raw-{time.monotonic_ns()}"
        directory.mkdir()
        payload = b"".join(raw_line(i) for i in range(10))
        start = time.perf_counter()
        for t in range(n):
            fd = os.open(directory / f"t{t}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, payload)
                _datasync(fd)
            finally:
                os.close(fd)
        elapsed = time.perf_counter() - start
        shutil.rmtree(directory)
        return elapsed

    async def roder() -> float:
        base = root / f"w5-roder-{time.monotonic_ns()}"
        items = [user_item(i) for i in range(10)]
        async with runtime_at(base) as runtime:
            start = time.perf_counter()
            for _ in range(n):
                tid = (await runtime.create_thread()).thread_id
                await persist_many(runtime, tid, items)
            elapsed = time.perf_counter() - start
        shutil.rmtree(base)
        return elapsed

    peer_fn: Callable[[], Awaitable[float]] | None = None
    if peer_available():

        async def peer() -> float:
            db = root / f"w5-peer-{time.monotonic_ns()}.db"
            items = [peer_item(i) for i in range(10)]
            start = time.perf_counter()
            for t in range(n):
                with peer_session(f"t{t}", db) as session:
                    await session.add_items(items)
            elapsed = time.perf_counter() - start
            db.unlink()
            return elapsed

        peer_fn = peer

    async def same_syncs() -> float:
        # The file operations a durable create and first append need with a journal never
        # without its first line (the line synced in a temporary file, linked, the directory
        # synced; then the append synced), in a plain loop: the floor of W5 for that design.
        directory = root / f"w5-syncs-{time.monotonic_ns()}"
        (directory / "tmp").mkdir(parents=True)
        header = raw_line(0)
        payload = b"".join(raw_line(i) for i in range(10))
        start = time.perf_counter()
        for t in range(n):
            tmp, path = directory / "tmp" / f"t{t}", directory / f"t{t}.jsonl"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, header)
                _datasync(fd)
            finally:
                os.close(fd)
            os.link(tmp, path)
            os.unlink(tmp)
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, payload)
                _datasync(fd)
            finally:
                os.close(fd)
        elapsed = time.perf_counter() - start
        shutil.rmtree(directory)
        return elapsed

    extra: dict[str, float] = {}
    roder_s, raw_s, peer_s = await interleaved(
        roder, raw, peer_fn, sizes.repeats, {"same_syncs": same_syncs}, extra
    )
    return {"raw": raw_s, "roder": roder_s, "peer": peer_s, "raw_same_syncs": extra["same_syncs"]}


# --- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    unit: str  # "/s" (higher is better) or "ms" (lower is better)
    raw: float
    roder: float
    peer: float | None
    ratio: float  # in the direction of the target
    target: str
    met: bool | None  # None: an (info) row without a target


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}/s"
    return f"{value * 1000:,.2f} ms"


def rows_from(results: dict[str, dict[str, float | None]], sizes: Sizes) -> list[Row]:
    rows: list[Row] = []

    def rate_row(name: str, key: str, target: float, baseline: float) -> None:
        r = results[key]
        assert r["raw"] is not None and r["roder"] is not None
        ratio = r["roder"] / baseline
        met = ratio >= target and (r["peer"] is None or r["roder"] > r["peer"])
        rows.append(Row(name, "/s", r["raw"], r["roder"], r["peer"], ratio, f">= {target} x", met))

    def time_row(name: str, key: str, target: float, *, faster: bool) -> None:
        r = results[key]
        assert r["raw"] is not None and r["roder"] is not None
        # faster: a speed ratio (raw time / Roder time, >= target); else a time ratio.
        ratio = r["raw"] / r["roder"] if faster else r["roder"] / r["raw"]
        ok = ratio >= target if faster else ratio <= target
        met = ok and (r["peer"] is None or r["roder"] < r["peer"])
        sign = ">=" if faster else "<="
        label = "speed" if faster else "time"
        target_text = f"{label} {sign} {target} x"
        rows.append(Row(name, "ms", r["raw"], r["roder"], r["peer"], ratio, target_text, met))

    if "w1" in results:
        raw1 = results["w1"]["raw"]
        assert raw1 is not None
        rate_row(f"W1 persist_turn_item x {sizes.w1_items:,}", "w1", 0.7, raw1)
        hop = results["w1"].get("raw_via_thread")
        if hop is not None:
            r1 = results["w1"]
            assert r1["roder"] is not None
            rows.append(
                Row(
                    "W1 (info) raw: write+fdatasync via a thread",
                    "/s",
                    hop,
                    r1["roder"],
                    r1["peer"],
                    r1["roder"] / hop,
                    "(info)",
                    None,
                )
            )
    if "w2" in results:
        # The target: 8 x a sync per append (W1's raw rate), each commit durable.
        base = results["w1"]["raw"] if "w1" in results else None
        raw2 = results["w2"]["raw"]
        assert raw2 is not None
        rate_row(
            "W2 50 concurrent persist_turn_item (vs W1 raw)",
            "w2",
            8.0,
            base if base is not None else raw2,
        )
    if "w3" in results:
        time_row(f"W3 load_thread, {sizes.w3_items:,} items", "w3", 0.5, faster=True)
    if "w4" in results:
        time_row(f"W4 replay_history, 20 of {sizes.w3_items:,}", "w4", 3.0, faster=False)
    if "w5" in results:
        time_row(f"W5 create_thread x {sizes.w5_threads:,}, 10 items", "w5", 1.5, faster=False)
        same = results["w5"].get("raw_same_syncs")
        if same is not None:
            r5 = results["w5"]
            assert r5["roder"] is not None
            rows.append(
                Row(
                    "W5 (info) raw: the 3 syncs of create + append",
                    "ms",
                    same,
                    r5["roder"],
                    r5["peer"],
                    r5["roder"] / same,
                    "(info)",
                    None,
                )
            )
    return rows


def print_table(rows: list[Row], results: dict[str, dict[str, float | None]]) -> None:
    header = ("workload (public API)", "raw", "SQLiteSession", "Roder", "ratio", "target", "met")
    table = [header]
    for row in rows:
        table.append(
            (
                row.name,
                _fmt(row.raw, row.unit),
                _fmt(row.peer, row.unit),
                _fmt(row.roder, row.unit),
                f"{row.ratio:.2f}",
                row.target if row.met is None else row.target + " & ahead of peer",
                "-" if row.met is None else "yes" if row.met else "NO",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for index, line in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if index == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if "w3" in results:
        w3r = results["w3"]
        print(
            f"W3 peak memory: Roder {w3r['roder_peak_mb']:.1f} MB, raw {w3r['raw_peak_mb']:.1f} MB"
        )
    if not peer_available():
        print("note: openai-agents is not installed; the SQLiteSession column is skipped")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(",")) if args.only else {"w1", "w2", "w3", "w4", "w5"}
    root = Path(tempfile.mkdtemp(prefix="roder-api-bench-", dir=args.dir))
    results: dict[str, dict[str, float | None]] = {}
    try:
        if "w1" in only or "w2" in only:
            results["w1"] = await w1(root, sizes)
        if "w2" in only:
            results["w2"] = await w2(root, sizes)
        if "w3" in only or "w4" in only:
            thread = await long_thread(root, sizes.w3_items, boundary_from_end=20)
            if "w3" in only:
                results["w3"] = await w3(thread, sizes)
            if "w4" in only:
                results["w4"] = await w4(thread, sizes)
        if "w5" in only:
            results["w5"] = await w5(root, sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = rows_from(results, sizes)
    durability = jsonl_factory(root).durability
    print(
        f"Roder: public Runtime API, JSONL store, default durability {durability!r}; "
        f"{'quick' if args.quick else 'full'} sizes {sizes}"
    )
    print_table(rows, results)
    return {
        "quick": args.quick,
        "durability": durability,
        "sizes": sizes.__dict__,
        "peer_installed": peer_available(),
        "results": results,
        "rows": [row.__dict__ for row in rows],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    parser.add_argument("--only", metavar="W1,W2,...", help="run only these workloads")
    parser.add_argument("--dir", help="where to put the temporary files (default: the tmp dir)")
    parser.add_argument(
        "--durability", help="the JSONL durability to measure (default: the store's default)"
    )
    args = parser.parse_args(argv)
    global DURABILITY
    DURABILITY = args.durability
    if args.only:
        args.only = args.only.lower()
    data = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
