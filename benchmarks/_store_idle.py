"""W7 of ``store_bench.py``: the CPU of threads being waited on (``wait_for_events``).

A server keeps each thread it answered lately followed: its session waits for other
processes' appends, which on the JSONL store only a poll finds. This measures the process
CPU per second of ``count`` such waits on a real store, in their steady state (pauses grown
to the longest, after a settling second), three ways, alternating:

- the store's ``wait_for_events`` (the kit's poll grid: one leader reads every thread due);
- each waiter polling alone (``poll_for_events`` over the store's coalesced reads: the
  shape before the grid, still every store's default);
- raw: one thread that ``stat`` s every journal at the same pace (the least a poll of
  files costs), in this process.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio

from roder_api.storekit import BlockingThreadStore, poll_for_events
from roder_api.threads import ThreadMetadata

WAITED_S = 3.0  # the window measured, after SETTLE_S
SETTLE_S = 1.2


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _window(start: Callable[[anyio.abc.TaskGroup], None]) -> float:
    """Run what ``start`` starts; return its CPU ms per second over the window."""
    async with anyio.create_task_group() as task_group:
        start(task_group)
        await anyio.sleep(SETTLE_S)
        used, began = _cpu_s(), time.monotonic()
        await anyio.sleep(WAITED_S)
        rate = (_cpu_s() - used) / (time.monotonic() - began) * 1e3
        task_group.cancel_scope.cancel()
    return rate


def _raw_stats(paths: list[Path], pause_s: float, stop: threading.Event) -> None:
    while not stop.wait(pause_s):
        for path in paths:
            path.stat()


async def idle_waits(store: BlockingThreadStore, root: Path, count: int) -> dict[str, Any]:
    """Return W7's row: CPU ms per second of ``count`` waits, the grid against the rest."""
    ids = [f"w7-{i:05d}" for i in range(count)]
    for thread_id in ids:
        await store.create_thread(ThreadMetadata(thread_id, 1, 1))
    longest = store.wait_poll_s[1]

    Wait = Callable[[str], Coroutine[Any, Any, int]]

    def waits(wait: Wait) -> Callable[[anyio.abc.TaskGroup], None]:
        def start(task_group: anyio.abc.TaskGroup) -> None:
            for thread_id in ids:
                task_group.start_soon(wait, thread_id)

        return start

    async def grid(thread_id: str) -> int:
        return await store.wait_for_events(thread_id, 1, 3600.0)

    async def alone(thread_id: str) -> int:
        return await poll_for_events(store, thread_id, 1, 3600.0, read=store.read_last_sequence)

    journals = await anyio.to_thread.run_sync(lambda: sorted(root.rglob("w7-*.jsonl")))
    assert len(journals) == count, f"found {len(journals)} journals of {count}"

    async def raw() -> float:
        stop = threading.Event()
        worker = threading.Thread(target=_raw_stats, args=(journals, longest, stop))
        worker.start()
        try:
            return await _window(lambda task_group: None)
        finally:
            stop.set()
            await anyio.to_thread.run_sync(worker.join)

    rates: dict[str, list[float]] = {"grid": [], "alone": [], "raw": []}
    for _ in range(2):  # alternating
        rates["grid"].append(await _window(waits(grid)))
        rates["alone"].append(await _window(waits(alone)))
        rates["raw"].append(await raw())
    best = {name: min(values) for name, values in rates.items()}
    return {
        "workload": f"W7 {count} threads waited on (wait_for_events), CPU",
        "unit": "ms/s",
        "store": best["grid"],
        "raw": best["raw"],
        "ratio": best["grid"] / best["raw"],
        "target": "(info)",
        "met": None,
        "note": f"each waiter polling alone (before the grid): {best['alone']:.1f} ms/s; "
        "raw: one thread stats every journal each pause",
        "alone": best["alone"],
    }
