"""The raw file baselines of ``store_bench``: the same file work as the JSONL store, by hand."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson

from roder_api.events import ItemCompleted
from roder_api.transcript import UserMessage

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)

TEXT = "lorem ipsum dolor sit amet " * 12  # about 400 bytes per journal line, framed


def item(i: int) -> ItemCompleted:
    return ItemCompleted(f"turn-{i // 4}", UserMessage(f"{i} {TEXT}"))


# --- raw baselines --------------------------------------------------------------------------


def _raw_line() -> bytes:
    line = orjson.dumps({"type": "item_completed", "text": TEXT}) + b"\n"
    return line + b" " * max(0, 400 - len(line))


def raw_sync_appends(directory: Path, count: int) -> list[float]:
    """Return the latency of each of ``count`` write+fdatasync of one ~400-byte line."""
    path = directory / f"raw-{time.monotonic_ns()}.jsonl"
    line = _raw_line()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    latencies = []
    clock = time.perf_counter
    try:
        for _ in range(count):
            start = clock()
            os.write(fd, line)
            _datasync(fd)
            latencies.append(clock() - start)
        return latencies
    finally:
        os.close(fd)
        path.unlink()


async def raw_sync_appends_via_threads(directory: Path, count: int) -> list[float]:
    """Return the latency of each write+fdatasync, each run in a worker thread.

    What any anyio code that keeps blocking I/O off the event loop pays per durable append.
    """
    path = directory / f"raw-hop-{time.monotonic_ns()}.jsonl"
    line = _raw_line()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append() -> None:
        os.write(fd, line)
        _datasync(fd)

    latencies = []
    clock = time.perf_counter
    try:
        for _ in range(count):
            start = clock()
            await anyio.to_thread.run_sync(append)
            latencies.append(clock() - start)
        return latencies
    finally:
        os.close(fd)
        path.unlink()


def raw_parallel_syncs(directory: Path, files: int, rounds: int, workers: int) -> float:
    """Return appends/s writing one line to each of ``files`` files, then syncing all of them
    from ``workers`` threads, ``rounds`` times: what the filesystem allows for group commits
    that span many journals."""
    from concurrent.futures import ThreadPoolExecutor

    line = _raw_line()
    paths = [directory / f"raw-par-{time.monotonic_ns()}-{i}.jsonl" for i in range(files)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for p in paths]
    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(_datasync, fds))
            start = time.perf_counter()
            for _ in range(rounds):
                for fd in fds:
                    os.write(fd, line)
                list(pool.map(_datasync, fds))
            return files * rounds / (time.perf_counter() - start)
    finally:
        for fd, path in zip(fds, paths, strict=True):
            os.close(fd)
            path.unlink()


def raw_load(path: Path) -> list[Any]:
    with open(path, "rb") as file:
        return [orjson.loads(line) for line in file]


def raw_tail(path: Path, lines: int = 20) -> list[Any]:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        chunk = 1 << 14
        while True:
            file.seek(max(0, size - chunk))
            data = file.read()
            parts = data.split(b"\n")
            if len(parts) > lines + 1 or chunk >= size:
                break
            chunk *= 2
    return [orjson.loads(line) for line in parts[-lines - 1 : -1]]


def raw_creates(root: Path, count: int) -> list[float]:
    """The file work of ``count`` durable creates, timed one by one: a new file written and
    synced under ``tmp/``, linked into place, the directory synced, the temporary unlinked
    (the JSONL store's own steps, without its locks, checks and index)."""
    tmp, threads = root / "raw-create" / "tmp", root / "raw-create" / "threads"
    tmp.mkdir(parents=True, exist_ok=True)
    threads.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps({"v": 1, "k": "create", "meta": {"thread_id": "x" * 32}}) + b"\n"
    directory = os.open(threads, os.O_RDONLY)
    times = []
    try:
        for i in range(count):
            start = time.perf_counter()
            path = f"{tmp}/{time.monotonic_ns()}-{i}.tmp"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, line)
                _datasync(fd)
                os.link(path, f"{threads}/{time.monotonic_ns()}-{i}.jsonl")
            finally:
                os.close(fd)
                os.unlink(path)
            os.fsync(directory)
            times.append(time.perf_counter() - start)
    finally:
        os.close(directory)
    return times


def raw_scandir(directory: Path) -> int:
    return sum(1 for entry in os.scandir(directory) if entry.name.endswith(".jsonl"))


async def append_many(store: Any, thread_id: str, count: int, returned: list[int]) -> None:
    for i in range(count):
        appended = await store.append_events(thread_id, [item(i)])
        returned.append(appended[0].sequence)
