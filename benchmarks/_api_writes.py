"""The public-API benchmark's write workloads: W1, W2 (durable appends) and W5 (new threads)."""

from __future__ import annotations

import asyncio  # SQLiteSession (the peer) runs on asyncio only
import os
import queue
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _api_common import (
    Sizes,
    interleaved,
    peer_available,
    peer_item,
    peer_session,
    persist_many,
    raw_line,
    runtime_at,
    user_item,
)

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def synced_writes(path: Path, chunks: list[bytes]) -> float:
    """Return the seconds to append each chunk to a new file with ``write`` + ``fdatasync``
    (one sync per chunk: the raw W1 and W2 baselines); the file is removed after."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for chunk in chunks:
            os.write(fd, chunk)
            _datasync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()


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
        return synced_writes(
            root / f"w1-{time.monotonic_ns()}.jsonl", [raw_line(i) for i in range(n)]
        )

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
        batch = b"".join(raw_line(i) for i in range(tasks))
        return synced_writes(root / f"w2-{time.monotonic_ns()}.jsonl", [batch] * rounds)

    async def peer() -> float:
        with peer_session(f"s{time.monotonic_ns()}", root / "w2-peer.db") as session:
            start = time.perf_counter()
            for _ in range(rounds):
                await session.add_items([peer_item(i) for i in range(tasks)])
            return time.perf_counter() - start

    async def peer_singles() -> float:
        # Like for like with Roder's W2: ``tasks`` concurrent single-item calls per round.
        with peer_session(f"s{time.monotonic_ns()}", root / "w2-peer-singles.db") as session:
            start = time.perf_counter()
            for _ in range(rounds):
                await asyncio.gather(*(session.add_items([peer_item(i)]) for i in range(tasks)))
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

        async def roder_batch() -> float:
            # The like-for-like call to the peer's: one batch of ``tasks`` items per round.
            tid = (await runtime.create_thread()).thread_id
            start = time.perf_counter()
            for _ in range(rounds):
                await persist_many(runtime, tid, [user_item(i) for i in range(tasks)])
            return time.perf_counter() - start

        extra: dict[str, float] = {}
        more: dict[str, Callable[[], Awaitable[float]]] = {"batch": roder_batch}
        if peer_available():
            more["peer_singles"] = peer_singles
        roder_s, raw_s, peer_s = await interleaved(
            roder, raw, peer if peer_available() else None, sizes.repeats, more, extra
        )
    return {
        "raw": total / raw_s,
        "roder": total / roder_s,
        "peer": None if peer_s is None else total / peer_s,
        "roder_batch": total / extra["batch"],
        "peer_singles": total / extra["peer_singles"] if "peer_singles" in extra else None,
    }


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
