"""Benchmark the JSONL, SQLite and PostgreSQL thread stores on the same workloads.

Each store runs through the same ``ThreadStore`` API, next to a raw baseline of its own
medium measured in the same run (JSONL: ``write`` + ``fsync`` per item and reading the file;
SQLite: ``sqlite3`` insert + commit per item and a plain SELECT; PostgreSQL: ``psycopg``
insert per item in autocommit and a plain SELECT):

- W1: single durable appends of ~400-byte items to one thread;
- W2: 32 concurrent tasks appending durably, to one thread and to 32 threads;
- W3: loading a large thread in a fresh store object, and through the public API
  (``Runtime.load_thread`` on a runtime opened just before); target for SQLite and
  PostgreSQL: ≥ 0.6 × their raw driver baseline (a plain SELECT and ``orjson.loads`` per
  row);
- W4: replaying that thread (its last boundary 20 items from the end) and a 500-item one;
- W5: the first page of 50 threads.

Ratios are store speed / raw speed (1.0: as fast as the raw baseline; W2 is compared with
the raw one-at-a-time append rate). Medians of several repeats. PostgreSQL runs when
``RODER_POSTGRES_DSN`` (or the local test server) is reachable, in a throwaway schema.

Usage: python benchmarks/backends_bench.py [--quick] [--json] [--reads]
[--stores jsonl,sqlite,postgres] (``--reads``: only W3 and W4)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
from _backend_raw import Raw, RawFile, RawPostgres, RawSqlite, item

from roder_api.events import Event
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.testing.conformance import make_metadata, native_boundary
from roder_api.threads import ThreadStore, ThreadStoreFactory
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_sqlite_thread_store import SqliteThreadStoreFactory

LOCAL_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does."""

    appends: int
    concurrent_per_task: int
    large_thread: int
    small_thread: int
    threads: int
    repeats: int
    read_repeats: int


FULL = Sizes(1500, 40, 50_000, 500, 1000, 5, 15)
QUICK = Sizes(90, 4, 2000, 200, 100, 3, 7)


@dataclass
class Row:
    """One measurement: the store's figure, the raw baseline's, and their ratio."""

    workload: str
    store: str
    unit: str
    value: float
    baseline: float
    ratio: float
    target: float | None = None
    """The least ratio wanted (None: no target for this row)."""

    @property
    def met(self) -> bool | None:
        """Return whether the row reaches its target (None: it has none)."""
        return None if self.target is None else self.ratio >= self.target


def median_time(func: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def amedian_time(func: Callable[[], Awaitable[Any]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- the store workloads ----------------------------------------------------------------------


async def fill(store: ThreadStore, thread_id: str, count: int, boundary_from_end: int) -> None:
    """Append ``count`` items (a boundary ``boundary_from_end`` items before the end)."""
    await store.create_thread(make_metadata(thread_id))
    batch: list[Event] = []
    for index in range(count):
        batch.append(native_boundary() if index == count - boundary_from_end else item(index))
        if len(batch) == 1000:
            await store.append_events(thread_id, batch)
            batch = []
    if batch:
        await store.append_events(thread_id, batch)


async def bench_store(
    name: str,
    factory: ThreadStoreFactory,
    raw: Raw,
    sizes: Sizes,
    rows: list[Row],
    *,
    reads_only: bool = False,
) -> None:
    def add(
        workload: str,
        unit: str,
        value: float,
        baseline: float,
        ratio: float,
        target: float | None = None,
    ) -> None:
        rows.append(Row(workload, name, unit, value, baseline, ratio, target))
        print(
            f"  {workload:<38} {value:>12,.0f} {unit:<10} raw {baseline:>12,.0f}"
            f"  ratio {ratio:.2f}",
            file=sys.stderr,
        )

    print(f"{name}:", file=sys.stderr)
    store = await factory.open()
    try:
        if not reads_only:
            await bench_writes(store, raw, sizes, add)
        # W3 / W4: load and replay a large thread; replay a small one.
        large, small = f"large-{uuid.uuid4().hex[:8]}", f"small-{uuid.uuid4().hex[:8]}"
        await fill(store, large, sizes.large_thread, 20)
        await fill(store, small, sizes.small_thread, 20)
    finally:
        await store.aclose()
    await bench_reads(name, factory, raw, sizes, add, large, small)
    if not reads_only:
        await bench_listing(factory, raw, sizes, add)


Add = Callable[..., None]


async def bench_writes(store: ThreadStore, raw: Raw, sizes: Sizes, add: Add) -> None:
    """W1 and W2 on an open store."""
    # W1: single durable appends, one at a time; raw and store rounds interleaved so
    # that both see the same disk weather.
    tid = (await store.create_thread(make_metadata())).thread_id
    per_round = max(1, sizes.appends // sizes.repeats)
    raw_rates, rates = [], []
    for _ in range(sizes.repeats):
        raw_rates.append(per_round / median_time(lambda: raw.append_each(per_round), 1))

        async def appends() -> None:
            for index in range(per_round):
                await store.append_events(tid, [item(index)])

        rates.append(per_round / await amedian_time(appends, 1))
    raw_rate, rate = statistics.median(raw_rates), statistics.median(rates)
    add("W1 single durable append", "appends/s", rate, raw_rate, rate / raw_rate)

    # W2: 32 concurrent tasks, to one thread and to 32 threads.
    per_task = sizes.concurrent_per_task
    one = (await store.create_thread(make_metadata())).thread_id
    many = [(await store.create_thread(make_metadata())).thread_id for _ in range(32)]
    for label, targets in (("one thread", [one] * 32), ("32 threads", many)):

        async def concurrent(targets: list[str] = targets) -> None:
            async def task(thread_id: str) -> None:
                for index in range(per_task):
                    await store.append_events(thread_id, [item(index)])

            async with anyio.create_task_group() as tg:
                for thread_id in targets:
                    tg.start_soon(task, thread_id)

        rate = 32 * per_task / await amedian_time(concurrent, 1)
        add(f"W2 32 tasks, {label}", "appends/s", rate, raw_rate, rate / raw_rate)


async def bench_reads(
    name: str,
    factory: ThreadStoreFactory,
    raw: Raw,
    sizes: Sizes,
    add: Add,
    large: str,
    small: str,
) -> None:
    """W3 and W4 on the filled threads ``large`` and ``small``."""
    raw.prepare_load(sizes.large_thread)

    async def fresh(work: Callable[[ThreadStore], Awaitable[Any]], repeats: int) -> float:
        """Return the median time of ``work`` on a store object opened just before it."""
        times = []
        for _ in range(repeats):
            fresh_store = await factory.open()
            try:
                start = time.perf_counter()
                await work(fresh_store)
                times.append(time.perf_counter() - start)
            finally:
                await fresh_store.aclose()
        return statistics.median(times)

    # W3: raw, store and Runtime rounds interleaved, so that all three see the same weather
    # (the machine is shared); medians of each.
    raw_times, load_times, api_times = [], [], []
    for _ in range(sizes.repeats):
        gc.collect()
        raw_times.append(median_time(raw.load, 1))
        gc.collect()
        load_times.append(await fresh(lambda s: s.read_events(large), 1))
        api_times.append(await fresh_runtime_load(name, factory, large, sizes.large_thread, 1))
    raw_load = sizes.large_thread / statistics.median(raw_times)
    load_rate = sizes.large_thread / statistics.median(load_times)
    w3_target = None if name == "jsonl" else 0.6
    add(
        f"W3 load {sizes.large_thread:,} items",
        "items/s",
        load_rate,
        raw_load,
        load_rate / raw_load,
        w3_target,
    )
    api_rate = sizes.large_thread / statistics.median(api_times)
    add(
        f"W3 Runtime.load_thread {sizes.large_thread:,}",
        "items/s",
        api_rate,
        raw_load,
        api_rate / raw_load,
        w3_target,
    )
    raw_tail = median_time(lambda: raw.tail(20), sizes.read_repeats)
    replay_large = await fresh(lambda s: s.replay_events(large), sizes.read_repeats)
    replay_small = await fresh(lambda s: s.replay_events(small), sizes.read_repeats)
    add(
        f"W4 replay {sizes.large_thread:,}-item thread",
        "us",
        replay_large * 1e6,
        raw_tail * 1e6,
        raw_tail / replay_large,
    )
    add(
        f"W4 replay {sizes.small_thread}-item thread",
        "us",
        replay_small * 1e6,
        raw_tail * 1e6,
        raw_tail / replay_small,
    )


async def bench_listing(factory: ThreadStoreFactory, raw: Raw, sizes: Sizes, add: Add) -> None:
    """W5: the first page of 50 threads."""
    store = await factory.open()
    try:
        existing = len((await store.list_threads(limit=1000)).threads)
        for _ in range(max(0, sizes.threads - existing)):
            await store.create_thread(make_metadata())
        page_time = await amedian_time(lambda: store.list_threads(limit=50), sizes.read_repeats)
    finally:
        await store.aclose()
    raw.prepare_listing(sizes.threads)
    raw_page = median_time(raw.first_page, sizes.read_repeats)
    add(
        f"W5 first page of {sizes.threads:,} threads",
        "us",
        page_time * 1e6,
        raw_page * 1e6,
        raw_page / page_time,
    )


async def fresh_runtime_load(
    name: str, factory: ThreadStoreFactory, thread_id: str, items: int, repeats: int
) -> float:
    """Return the median time of ``Runtime.load_thread`` on a runtime opened just before."""
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory)
    times = []
    for _ in range(repeats):
        async with Runtime(builder.build(), RuntimeConfig(thread_store=name)) as runtime:
            await runtime.store()
            gc.collect()
            start = time.perf_counter()
            snapshot = await runtime.load_thread(thread_id)
            times.append(time.perf_counter() - start)
            assert snapshot is not None and len(snapshot.items) == items
            del snapshot
    return statistics.median(times)


def postgres_dsn() -> str | None:
    """Return a reachable PostgreSQL DSN, or None."""
    try:
        import psycopg
    except ImportError:
        return None
    dsn = os.environ.get("RODER_POSTGRES_DSN") or os.environ.get(
        "RODER_TEST_POSTGRES_DSN", LOCAL_TEST_DSN
    )
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            return dsn
    except psycopg.OperationalError:
        return None


@contextlib.contextmanager
def postgres_schema(dsn: str) -> Iterator[str]:
    import psycopg

    schema = f"roder_bench_{uuid.uuid4().hex[:10]}"
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def run(sizes: Sizes, stores: list[str], reads_only: bool = False) -> list[Row]:
    rows: list[Row] = []
    base = Path(tempfile.mkdtemp(prefix="roder-bench-"))
    try:
        if "jsonl" in stores:
            raw: Raw = RawFile(base / "raw-file")
            factory: ThreadStoreFactory = JsonlThreadStoreFactory(base_path=base / "jsonl")
            await bench_store("jsonl", factory, raw, sizes, rows, reads_only=reads_only)
        if "sqlite" in stores:
            raw = RawSqlite(base / "raw-sqlite")
            try:
                factory = SqliteThreadStoreFactory(base / "store.sqlite3")
                await bench_store("sqlite", factory, raw, sizes, rows, reads_only=reads_only)
            finally:
                raw.close()
        if "postgres" in stores:
            dsn = postgres_dsn()
            if dsn is None:
                print("postgres: skipped (no reachable server)", file=sys.stderr)
            else:
                from roder_postgres_thread_store import PostgresThreadStoreFactory

                with postgres_schema(dsn) as schema:
                    raw = RawPostgres(dsn, schema)
                    try:
                        factory = PostgresThreadStoreFactory(dsn, schema=schema, max_size=8)
                        await bench_store(
                            "postgres", factory, raw, sizes, rows, reads_only=reads_only
                        )
                    finally:
                        raw.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def print_table(rows: list[Row]) -> None:
    cells = [("workload", "store", "store", "raw baseline", "store/raw", "target", "met")]
    for row in rows:
        cells.append(
            (
                row.workload,
                row.store,
                f"{row.value:,.0f} {row.unit}",
                f"{row.baseline:,.0f} {row.unit}",
                f"{row.ratio:.2f}",
                "" if row.target is None else f">= {row.target}",
                {None: "", True: "yes", False: "NO"}[row.met],
            )
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    for index, line in enumerate(cells):
        padded = [
            text.ljust(width) if column < 2 else text.rjust(width)
            for column, (text, width) in enumerate(zip(line, widths, strict=True))
        ]
        print("| " + " | ".join(padded) + " |")
        if index == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--stores", default="jsonl,sqlite,postgres", help="comma list")
    parser.add_argument("--reads", action="store_true", help="only the reads (W3, W4)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    rows = anyio.run(run, sizes, stores, args.reads)
    if args.json:
        print(
            orjson.dumps(
                {"sizes": asdict(sizes), "rows": [{**asdict(r), "met": r.met} for r in rows]},
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
