"""Benchmark the JSONL thread store against raw file baselines measured in the same run.

Workloads (issue 5):

- W1: single durable appends of ~400-byte items to one thread, vs a raw loop of ``write`` +
  ``fdatasync`` per item (the same sync call the store uses); rates from the median latency
  of one append. An extra row compares with the raw loop run through ``anyio.to_thread``
  (the event loop/worker round trip every anyio store pays).
- W2: 32 concurrent tasks appending durably with group commit, to one thread and to 32
  threads, vs the raw sync-per-append rate of W1.
- W3: loading a 50,000-item thread in a fresh store object, vs reading the file and
  ``orjson.loads`` per line; and the peak memory (tracemalloc) of both.
- W4: replaying a 50,000-item thread whose last boundary is 20 items from the end, and the
  same for a 500-item thread, vs reading the last 20 lines of the file.
- W5: the first page of 50 threads out of 1,000 and out of 10,000, vs an ``os.scandir`` of
  the 10,000 journals.
- W6: durable creates one at a time (``create_thread`` in a worker thread), vs the same
  file work by hand (write and sync a new file, link it, sync the directory).
- W7: the CPU of 1,000 threads waited on for other processes' appends (``wait_for_events``),
  vs each waiter polling alone and a raw ``stat`` loop (``_store_idle.py``).

W3, W4 and W5 time the call on a store object opened just before (outside the timing), so
nothing of the thread is cached in memory: what they read comes from the index and the
journal. Raw and store runs alternate within a run.

Prints a table of medians and ratios; ``--json PATH`` writes the numbers; ``--quick`` runs
small sizes in a few seconds (CI's smoke test). Run: ``python benchmarks/store_bench.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
from _store_idle import idle_waits
from _store_raw import (
    append_many,
    item,
    raw_creates,
    raw_load,
    raw_parallel_syncs,
    raw_scandir,
    raw_sync_appends,
    raw_sync_appends_via_threads,
    raw_tail,
)

from roder_api.events import ItemCompleted, JournalEvent
from roder_api.threads import ThreadMetadata
from roder_api.transcript import ContextCompaction
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._store import SYNC_WORKERS

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


@dataclass
class Sizes:
    w1_appends: int
    w2_per_task: int
    w3_items: int
    w4_long: int
    w4_short: int
    w5_small: int
    w5_large: int
    repeats: int
    w1_repeats: int


FULL = Sizes(5000, 50, 50_000, 50_000, 500, 1000, 10_000, 5, 3)
QUICK = Sizes(200, 5, 3000, 3000, 500, 100, 1000, 3, 3)


def meta(thread_id: str, at: int = 1_700_000_000_000) -> ThreadMetadata:
    return ThreadMetadata(thread_id=thread_id, created_at_ms=at, updated_at_ms=at)


def median_time(func: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def amedian_time(func: Callable[[], Awaitable[Any]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        await func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- the workloads --------------------------------------------------------------------------


class Bench:
    def __init__(self, root: Path, sizes: Sizes) -> None:
        self.root = root
        self.sizes = sizes
        self.rows: list[dict[str, Any]] = []
        self.counter = 0

    def factory(
        self, durability: str = "fsync", name: str | None = None
    ) -> JsonlThreadStoreFactory:
        self.counter += 1
        return JsonlThreadStoreFactory(
            base_path=self.root / (name or f"store-{self.counter}"), durability=durability
        )

    def row(self, **values: Any) -> None:
        self.rows.append(values)

    async def w1(self) -> float:
        n, repeats = self.sizes.w1_appends, self.sizes.w1_repeats
        raw: list[float] = []
        hop: list[float] = []
        mine: list[float] = []
        store = await self.factory("fsync").open()
        events = [[item(i)] for i in range(n)]
        clock = time.perf_counter
        for round_ in range(repeats):
            # Raw and store alternate, so that both see the same disk and the same neighbours.
            # The raw loop runs on this thread and in a worker thread (where the store's syncs
            # run; on our test machine that was faster); the faster one is the baseline.
            here = raw_sync_appends(self.root, n)
            there = await anyio.to_thread.run_sync(raw_sync_appends, self.root, n)
            raw.extend(min(here, there, key=statistics.median))
            hop.extend(await raw_sync_appends_via_threads(self.root, n))
            thread_id = f"w1-{round_}"
            await store.create_thread(meta(thread_id))
            for batch in events:
                start = clock()
                await store.append_events(thread_id, batch)
                mine.append(clock() - start)
        await store.aclose()
        # Rates from the median latency of one append: robust to the disk's rare slow syncs.
        raw_rate = 1 / statistics.median(raw)
        store_rate = 1 / statistics.median(mine)
        hop_rate = 1 / statistics.median(hop)
        self.row(
            workload=f"W1 {n:,} single durable appends, one thread",
            unit="appends/s",
            store=store_rate,
            raw=raw_rate,
            ratio=store_rate / raw_rate,
            target=">= 0.8",
            met=store_rate / raw_rate >= 0.8,
        )
        self.row(
            workload="W1 (info) raw loop, each write+sync via anyio.to_thread",
            unit="appends/s",
            store=store_rate,
            raw=hop_rate,
            ratio=store_rate / hop_rate,
            target="(info)",
            met=None,
            note="raw column: the raw loop paying the same event loop/thread round trip",
        )
        return raw_rate

    async def w2(self, raw_rate: float) -> None:
        per_task, repeats = self.sizes.w2_per_task, self.sizes.repeats
        for threads in (1, 32):
            times = []
            for _ in range(repeats):
                store = await self.factory("group").open()
                for t in range(threads):
                    await store.create_thread(meta(f"w2-{t}"))
                returned: list[int] = []
                start = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for index in range(32):
                        group.start_soon(
                            append_many, store, f"w2-{index % threads}", per_task, returned
                        )
                times.append(time.perf_counter() - start)
                total = 32 * per_task
                assert len(returned) == total
                # Every commit returned; each was synced before it did (group durability).
                last = 0
                for t in range(threads):
                    last += (await store.get_thread(f"w2-{t}")).last_sequence
                assert last == total, (last, total)
                await store.aclose()
            rate = 32 * per_task / statistics.median(times)
            self.row(
                workload=f"W2 32 tasks, group commit, {threads} thread{'s' * (threads > 1)}",
                unit="commits/s",
                store=rate,
                raw=raw_rate,
                ratio=rate / raw_rate,
                target=">= 8",
                met=rate / raw_rate >= 8,
            )
            if threads > 1:
                ceiling = raw_parallel_syncs(self.root, threads, per_task, SYNC_WORKERS)
                self.row(
                    workload=f"W2 (info) vs raw: {threads} files, write+sync all per round",
                    unit="commits/s",
                    store=rate,
                    raw=ceiling,
                    ratio=rate / ceiling,
                    target="(info)",
                    met=None,
                    note="raw column: the filesystem's ceiling for syncing many files",
                )

    async def build_thread(
        self, factory: JsonlThreadStoreFactory, thread_id: str, items: int, boundary_from_end: int
    ) -> Path:
        store = await factory.open()
        await store.create_thread(meta(thread_id))
        chunk: list[JournalEvent] = []
        boundary_at = items - boundary_from_end if boundary_from_end else -1
        for i in range(items):
            event = (
                ItemCompleted("turn", ContextCompaction("summary")) if i == boundary_at else item(i)
            )
            chunk.append(JournalEvent(i + 1, 1_700_000_000_000 + i, event))
            if len(chunk) == 2000:
                await store.import_events(thread_id, chunk)
                chunk = []
        if chunk:
            await store.import_events(thread_id, chunk)
        path = store.journal_path(thread_id)
        await store.aclose()
        return path

    async def w3(self) -> None:
        n, repeats = self.sizes.w3_items, self.sizes.repeats
        factory = self.factory("none")
        path = await self.build_thread(factory, "w3", n, 0)
        raw_times, store_times = [], []
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            raw_load(path)
            raw_times.append(time.perf_counter() - start)
            store = await factory.open()  # a fresh store object: nothing of the thread cached
            gc.collect()
            start = time.perf_counter()
            events = await store.read_events("w3")
            await store.get_thread("w3")
            store_times.append(time.perf_counter() - start)
            assert len(events) == n
            del events
            await store.aclose()
        raw_time, store_time = statistics.median(raw_times), statistics.median(store_times)
        raw_rate, store_rate = n / raw_time, n / store_time
        self.row(
            workload=f"W3 load a {n:,}-item thread (fresh store)",
            unit="items/s",
            store=store_rate,
            raw=raw_rate,
            ratio=store_rate / raw_rate,
            target=">= 0.7",
            met=store_rate / raw_rate >= 0.7,
        )
        # Peak memory, each measured alone.
        gc.collect()
        tracemalloc.start()
        kept = raw_load(path)
        raw_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del kept
        gc.collect()
        store = await factory.open()
        tracemalloc.start()
        events = await store.read_events("w3")
        store_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del events
        await store.aclose()
        self.row(
            workload="W3 peak memory of the load",
            unit="MiB",
            store=store_peak / 2**20,
            raw=raw_peak / 2**20,
            ratio=store_peak / raw_peak,
            target="<= 1.0",
            met=store_peak <= raw_peak,
        )

    async def w4(self) -> None:
        repeats = max(self.sizes.repeats * 3, 9)
        long, short = self.sizes.w4_long, self.sizes.w4_short
        factories: dict[int, JsonlThreadStoreFactory] = {}
        paths: dict[int, Path] = {}
        for items in (long, short):
            factories[items] = self.factory("none")
            paths[items] = await self.build_thread(factories[items], "w4", items, 20)
        warm: dict[int, list[float]] = {long: [], short: []}
        fresh: dict[int, list[float]] = {long: [], short: []}
        raw_times: list[float] = []
        stores = {items: await factories[items].open() for items in (long, short)}
        for items in (long, short):
            await stores[items].get_thread("w4")  # an open store that has used the thread
        for _ in range(repeats):
            start = time.perf_counter()
            raw_tail(paths[long])
            raw_times.append(time.perf_counter() - start)
            for items in (long, short):
                start = time.perf_counter()
                events = await stores[items].replay_events("w4")
                warm[items].append(time.perf_counter() - start)
                assert len(events) == 20, len(events)
                store = await factories[items].open()  # fresh: the offset comes from the index
                start = time.perf_counter()
                events = await store.replay_events("w4")
                fresh[items].append(time.perf_counter() - start)
                assert len(events) == 20, len(events)
                await store.aclose()
        for store in stores.values():
            await store.aclose()
        raw_time = statistics.median(raw_times)
        for label, times in (("open store", warm), ("fresh store object", fresh)):
            t_long, t_short = statistics.median(times[long]), statistics.median(times[short])
            informative = label != "open store"  # the W4 is a store in use
            self.row(
                workload=f"W4 replay {long:,} vs {short:,} items, {label}",
                unit="ms",
                store=t_long * 1000,
                raw=t_short * 1000,
                ratio=t_long / t_short,
                target="(info)" if informative else "<= 1.5",
                met=None if informative else t_long / t_short <= 1.5,
                note="raw column: the short thread",
            )
            self.row(
                workload=f"W4 replay {long:,} items vs raw tail read, {label}",
                unit="ms",
                store=t_long * 1000,
                raw=raw_time * 1000,
                ratio=t_long / raw_time,
                target="(info)" if informative else "<= 3",
                met=None if informative else t_long / raw_time <= 3,
            )

    async def w5(self) -> None:
        repeats = max(self.sizes.repeats * 3, 9)
        small, large = self.sizes.w5_small, self.sizes.w5_large
        factories: dict[int, JsonlThreadStoreFactory] = {}
        for count in (small, large):
            factories[count] = self.factory("none")
            store = await factories[count].open()
            for i in range(count):
                await store.create_thread(meta(f"w5-{i:06d}", at=1_700_000_000_000 + i))
            await store.aclose()
        directory = factories[large].base_path / "threads"
        samples: dict[int, list[float]] = {small: [], large: []}
        scandir: list[float] = []
        for _ in range(repeats):
            start = time.perf_counter()
            raw_scandir(directory)
            scandir.append(time.perf_counter() - start)
            for count in (small, large):
                store = await factories[count].open()  # fresh: the page comes from the index
                start = time.perf_counter()
                page = await store.list_threads(limit=50)
                samples[count].append(time.perf_counter() - start)
                assert len(page.threads) == 50 and page.next_cursor
                await store.aclose()
        times = {count: statistics.median(values) for count, values in samples.items()}
        scandir_time = statistics.median(scandir)
        self.row(
            workload=f"W5 first page of 50: {large:,} vs {small:,} threads",
            unit="ms",
            store=times[large] * 1000,
            raw=times[small] * 1000,
            ratio=times[large] / times[small],
            target="<= 2",
            met=times[large] / times[small] <= 2,
            note="raw column: the smaller store",
        )
        self.row(
            workload=f"W5 first page of {large:,} threads vs raw scandir",
            unit="ms",
            store=times[large] * 1000,
            raw=scandir_time * 1000,
            ratio=times[large] / scandir_time,
            target="< 1",
            met=times[large] < scandir_time,
        )

    async def w6(self) -> None:
        count = self.sizes.w5_small // 2
        raw: list[float] = []
        mine: list[float] = []
        store = await self.factory("fsync").open()
        for round_ in range(self.sizes.repeats):  # raw and store alternate
            raw += await anyio.to_thread.run_sync(raw_creates, self.root, count)
            for i in range(count):
                start = time.perf_counter()
                await store.create_thread(meta(f"w6-{round_}-{i}"))
                mine.append(time.perf_counter() - start)
        await store.aclose()
        store_ms, raw_ms = statistics.median(mine) * 1000, statistics.median(raw) * 1000
        self.row(
            workload="W6 durable create_thread, one at a time",
            unit="ms",
            store=store_ms,
            raw=raw_ms,
            ratio=store_ms / raw_ms,
            target="(info)",
            met=None,
            note="raw column: the same file work and syncs by hand, in a worker thread",
        )

    async def run(self, only: set[str]) -> None:
        raw_rate = 0.0
        if {"w1", "w2"} & only:
            raw_rate = await self.w1()
            if "w1" not in only:
                del self.rows[-2:]
        if "w2" in only:
            await self.w2(raw_rate)
        if "w3" in only:
            await self.w3()
        if "w4" in only:
            await self.w4()
        if "w5" in only:
            await self.w5()
        if "w6" in only:
            await self.w6()
        if "w7" in only:
            store = await self.factory("none").open()
            self.row(**await idle_waits(store, self.root, self.sizes.w5_small))
            await store.aclose()


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'workload':<58} {'store':>12} {'raw':>12} {'unit':<10} {'ratio':>7} {'target':>7}  met"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['workload']:<58} {row['store']:>12,.2f} {row['raw']:>12,.2f} "
            f"{row['unit']:<10} {row['ratio']:>7.2f} {row['target']:>7}  "
            f"{'-' if row['met'] is None else 'yes' if row['met'] else 'NO'}"
        )
    for row in rows:
        if "alone" in row:
            print(f"{row['workload'][:2]}: {row['note']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few seconds)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--dir", metavar="DIR", help="where to put the stores (default: a tmp dir)")
    parser.add_argument(
        "--only", default="w1,w2,w3,w4,w5,w6,w7", help="comma list of workloads (default: all)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    root = Path(tempfile.mkdtemp(prefix="roder-bench-", dir=args.dir))
    bench = Bench(root, sizes)
    started = time.perf_counter()
    try:
        anyio.run(bench.run, set(args.only.split(",")))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    print(f"JSONL store benchmark ({'quick' if args.quick else 'full'}; medians; {elapsed:.1f} s)")
    print_table(bench.rows)
    if args.json:
        Path(args.json).write_text(
            orjson.dumps(
                {"quick": args.quick, "python": sys.version.split()[0], "rows": bench.rows},
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
