"""The store kit's process-wide worker pool: what ``BlockingThreadStore.run_sync`` runs on."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from roder_api.storekit import _workers, run_in_worker
from roder_api.testing.conformance import make_metadata
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory

pytestmark = pytest.mark.core


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "roder-store-worker"]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JsonlThreadStore]:
    opened = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.mark.anyio
async def test_the_result_comes_back_from_a_worker_thread(store: JsonlThreadStore) -> None:
    here = threading.get_ident()
    ident, value = await store.run_sync(lambda x: (threading.get_ident(), x * 2), 21)
    assert value == 42
    assert ident != here
    assert await run_in_worker(divmod, 7, 2) == (3, 1)


@pytest.mark.anyio
async def test_an_exception_reaches_the_caller_with_its_traceback(
    store: JsonlThreadStore,
) -> None:
    def refuse_in_the_worker(what: str) -> None:
        raise LookupError(f"no {what}")

    with pytest.raises(LookupError, match="no key") as caught:
        await store.run_sync(refuse_in_the_worker, "key")
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "refuse_in_the_worker" in frames
    with pytest.raises(KeyboardInterrupt):  # not only Exception: whatever the call raises
        await run_in_worker(lambda: (_ for _ in ()).throw(KeyboardInterrupt))


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_for_its_call_then_the_cancellation_takes_effect(
    store: JsonlThreadStore,
) -> None:
    finished = threading.Event()
    results: list[int] = []

    def slow() -> int:
        time.sleep(0.3)
        finished.set()
        return 7

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.05):
            results.append(await store.run_sync(slow))
            assert finished.is_set()  # the caller did not return before the call ended
            await anyio.lowlevel.checkpoint()
            raise AssertionError("the deadline was not raised at the next checkpoint")
    assert results == [7]
    assert time.monotonic() - started >= 0.3
    assert store.limiter.borrowed_tokens == 0


@pytest.mark.anyio
async def test_a_caller_cancelled_before_the_hand_over_runs_nothing(
    store: JsonlThreadStore,
) -> None:
    ran: list[int] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.run_sync(ran.append, 1)
    assert scope.cancelled_caught
    assert ran == []
    assert store.limiter.borrowed_tokens == 0


@pytest.mark.anyio
async def test_more_concurrent_calls_than_threads_all_complete_within_the_bounds() -> None:
    lock = threading.Lock()
    running = 0
    most = 0

    def work(index: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return index

    results: dict[int, int] = {}

    async def one(index: int) -> None:
        results[index] = await run_in_worker(work, index)

    calls = _workers.MAX_WORKERS * 3
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for index in range(calls):
                tg.start_soon(one, index)
    assert results == {index: index for index in range(calls)}
    assert 1 < most <= _workers.MAX_WORKERS
    assert len(worker_threads()) <= _workers.MAX_WORKERS


@pytest.mark.anyio
async def test_a_store_runs_at_most_max_threads_calls_at_once(
    store: JsonlThreadStore,
) -> None:
    lock = threading.Lock()
    running = 0
    most = 0

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(store.max_threads * 3):
                tg.start_soon(store.run_sync, work)
    assert most == store.max_threads
    assert store.limiter.borrowed_tokens == 0


@pytest.mark.anyio
async def test_idle_threads_end_and_the_next_call_starts_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_workers, "IDLE_EXIT_S", 0.2)
    # Every thread of the pool takes one of these calls (none passes the barrier alone),
    # so every one of them waits with the short idle period afterwards.
    barrier = threading.Barrier(_workers.MAX_WORKERS, timeout=20)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(_workers.MAX_WORKERS):
                tg.start_soon(run_in_worker, barrier.wait)
    assert len(worker_threads()) == _workers.MAX_WORKERS
    for thread in worker_threads():  # each ends after the idle period
        await anyio.to_thread.run_sync(thread.join, 10)
    assert worker_threads() == []
    assert _workers.worker_counts() == (0, 0)
    assert await run_in_worker(threading.current_thread) in worker_threads()
    assert _workers.worker_counts() == (1, 1)


@pytest.mark.anyio
async def test_with_several_threads_idle_a_call_wakes_only_the_one_idle_last() -> None:
    # Four threads made idle together; then calls one at a time. Each goes to the thread
    # that went idle last (the one that ran the call before): idle threads wait on a lock
    # each, so a call wakes that one thread (from one shared queue, any of them woke).
    barrier = threading.Barrier(4, timeout=20)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(run_in_worker, barrier.wait)
    assert _workers.worker_counts()[1] >= 4
    ran = [await run_in_worker(threading.get_ident) for _ in range(20)]
    assert len(set(ran)) == 1


def test_a_worker_survives_a_call_whose_event_loop_closed_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The caller's loop is gone when the call ends: the hand-back fails, the thread lives on.
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    closed = asyncio.new_event_loop()
    closed.close()
    ran = threading.Event()
    woken: list[str] = []
    for _ in range(3):  # more than one, so a thread that died would show (no one is left)
        _workers._pool.submit(
            _workers._Call(ran.set, (), closed.call_soon_threadsafe, lambda: woken.append("x"))
        )
    assert ran.wait(10)

    async def answered() -> threading.Thread:
        with anyio.fail_after(10):
            return await run_in_worker(threading.current_thread)

    assert anyio.run(answered) in worker_threads()
    assert failures == []
    assert woken == []


def use_a_store_in_a_child(base: str, backend: str) -> None:
    async def main() -> None:
        store = await JsonlThreadStoreFactory(base_path=Path(base)).open()
        try:
            with anyio.fail_after(10):
                created = await store.create_thread(make_metadata("child-thread"))
                assert (await store.get_thread(created.thread_id)).thread_id == "child-thread"
        finally:
            await store.aclose()

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_forked_child_uses_a_store_after_the_parent_did(tmp_path: Path, backend: str) -> None:
    base = tmp_path / "threads"

    async def parent() -> None:
        store = await JsonlThreadStoreFactory(base_path=base).open()
        try:
            await store.create_thread(make_metadata("parent-thread"))
        finally:
            await store.aclose()

    anyio.run(parent, backend=backend)
    assert worker_threads()  # the parent's pool has threads, which the child will not
    child = multiprocessing.get_context("fork").Process(
        target=use_a_store_in_a_child, args=(str(base), backend)
    )
    child.start()
    child.join(30)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0


def test_the_hand_back_needs_an_event_loop() -> None:
    with pytest.raises(RuntimeError, match="asyncio or trio"):
        _workers.thread_safe_caller()
