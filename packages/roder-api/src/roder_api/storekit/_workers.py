"""One process-wide pool of worker threads for the blocking calls of every store.

It is the one thread mechanism under the store path: ``BlockingThreadStore`` calls,
``GroupCommit`` batches, a store's parallel syncs (:func:`start_in_worker`) and its
opening and closing all run here.

``BlockingThreadStore.run_sync`` hands each blocking call to :func:`run_in_worker`: the
event loop hands the call to an idle thread of the pool (waking that one thread), and the
thread that ran it hands the outcome back with the event loop's own thread-safe "call
soon" (:func:`thread_safe_caller`; the same hand-back as ``GroupCommit``'s). That is one
thread wake-up each way per call, and none of ``anyio.to_thread``'s per-call bookkeeping.

The pool is shared by every store and event loop of the process, so a store opened just
before its first call finds threads already running. Threads start when work arrives and
no thread is idle (at most :data:`MAX_WORKERS`), and end after :data:`IDLE_EXIT_S` seconds
without work. After ``fork`` the child starts with an empty pool of its own (the parent's
threads do not exist there).
"""

from __future__ import annotations

import collections
import contextvars
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

T = TypeVar("T")

MAX_WORKERS = 32
"""How many worker threads the pool runs at most (calls beyond that wait their turn)."""

IDLE_EXIT_S = 10.0
"""How long a worker thread waits for a call before it ends (read when it starts waiting)."""


def thread_safe_caller() -> Callable[[Callable[[], object]], object]:
    """Return the running event loop's thread-safe "call soon".

    Backend-neutral: asyncio's ``loop.call_soon_threadsafe`` or trio's
    ``TrioToken.run_sync_soon``, whichever loop runs this thread (anyio runs on no other).
    Raise ``RuntimeError`` outside of both.
    """
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        try:
            return asyncio.get_running_loop().call_soon_threadsafe  # type: ignore[no-any-return]
        except RuntimeError:
            pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token().run_sync_soon  # type: ignore[no-any-return]
        except RuntimeError:
            pass
    raise RuntimeError("this must be awaited in an asyncio or trio event loop")


class _Call:
    """One blocking call: what to run, where to report, and (once run) its outcome."""

    __slots__ = ("args", "call_soon", "context", "error", "func", "result", "wake")

    def __init__(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        call_soon: Callable[[Callable[[], object]], object],
        wake: Callable[[], object] | None,
    ) -> None:
        self.func = func
        self.args = args
        self.context = contextvars.copy_context()  # like anyio.to_thread: the caller's
        self.call_soon = call_soon
        self.wake = wake
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        """Run the call, keeping its result or exception (on a worker thread)."""
        try:
            self.result = self.context.run(self.func, *self.args)
        except BaseException as exc:  # the caller raises it, whatever it is
            self.error = exc

    def report(self) -> None:
        """Wake the caller on its event loop (on a worker thread; nothing when ``wake`` is
        None: the call reported itself)."""
        if self.wake is None:
            return
        try:
            self.call_soon(self.wake)
        except RuntimeError:
            pass  # that event loop is closed: nobody waits for this call any more


def _call_now(wake: Callable[[], object]) -> object:
    """The "call soon" of a caller that is a thread, not an event loop: wake it at once."""
    return wake()


class _Idle:
    """An idle worker thread: the call it is handed, and the lock it waits on for it."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.call: _Call | None = None
        self.wake = threading.Lock()
        self.wake.acquire()  # released by whoever hands this thread a call


class _Pool:
    """The worker threads (one pool per process; a new one after fork).

    A call goes straight to an idle thread, the one that went idle last (its caches are
    warm), which waits on a lock of its own: one thread wakes per call. (Threads blocked in
    one shared ``queue.SimpleQueue`` get wake another idle thread on each put, which then
    takes the GIL only to wait again: measured, every single commit paid for that.) Calls
    that find every thread busy wait in ``backlog`` for the next one to finish.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Idle] = []  # under the lock; the last is woken first
        self.backlog: collections.deque[_Call] = collections.deque()  # under the lock
        self.workers = 0

    def submit(self, call: _Call, *, only_if_idle: bool = False) -> bool:
        """Hand ``call`` to an idle thread, else start one, else queue it for the next free.

        ``only_if_idle``: queue it only when a worker is idle or can be started (return
        False, nothing queued, when all :data:`MAX_WORKERS` are busy).
        """
        with self.lock:
            if self.idle:
                idle = self.idle.pop()
                idle.call = call
                idle.wake.release()
                return True
            if self.workers >= MAX_WORKERS:
                if only_if_idle:
                    return False
                self.backlog.append(call)
                return True
            self.workers += 1
        try:
            threading.Thread(
                target=self._work, args=(call,), name="roder-store-worker", daemon=True
            ).start()
        except BaseException:
            with self.lock:
                self.workers -= 1
            raise
        return True

    def _work(self, first: _Call) -> None:
        me = _Idle()
        call: _Call | None = first
        while call is not None:
            call.run()
            # Idle before the caller wakes: its next call must find this thread, not start one.
            with self.lock:
                following = self.backlog.popleft() if self.backlog else None
                if following is None:
                    self.idle.append(me)
            call.report()
            del call  # do not keep its result alive while idle
            call = following if following is not None else self._wait(me)

    def _wait(self, me: _Idle) -> _Call | None:
        """Wait (up to :data:`IDLE_EXIT_S`) for a call handed to this idle thread; None:
        none came, and this thread is no longer counted (it ends)."""
        if not me.wake.acquire(timeout=IDLE_EXIT_S):
            with self.lock:
                if me in self.idle:  # nobody handed it a call: end
                    self.idle.remove(me)
                    self.workers -= 1
                    return None
            me.wake.acquire()  # handed one as the wait ended: released under the lock already
        call, me.call = me.call, None
        return call

    def counts(self) -> tuple[int, int]:
        """Return (worker threads running, of which idle)."""
        with self.lock:
            return self.workers, len(self.idle)


_pool = _Pool()


def _new_pool_after_fork() -> None:
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_new_pool_after_fork)


def submit_to_pool(
    func: Callable[[], object],
    call_soon: Callable[[Callable[[], object]], object],
    wake: Callable[[], object] | None,
) -> None:
    """Run ``func()`` on a worker thread, then ``call_soon(wake)`` (its outcome is func's to
    keep: this is for callers that record it themselves, like ``GroupCommit``). With
    ``wake`` None nothing is called after: ``func`` wakes its caller itself."""
    _pool.submit(_Call(func, (), call_soon, wake))


def worker_counts() -> tuple[int, int]:
    """Return how many worker threads the pool runs and how many of them are idle."""
    return _pool.counts()


def _refuse_abort(raise_cancel: object) -> Any:
    """Keep a trio task waiting for its call when cancelled (``Abort.FAILED``)."""
    return sys.modules["trio"].lowlevel.Abort.FAILED


class WorkerCall:
    """A blocking call started from a thread with :func:`start_in_worker`; wait for it."""

    __slots__ = ("_call", "_done")

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._done = threading.Event()
        self._call = _Call(func, args, _call_now, self._done.set)

    def done(self) -> bool:
        """Return True once the call has finished."""
        return self._done.is_set()

    def result(self) -> Any:
        """Wait for the call; return its result or raise its exception (blocking)."""
        self._done.wait()
        call = self._call
        if call.error is not None:
            error, call.error = call.error, None  # no reference cycle through the traceback
            raise error
        return call.result


def start_in_worker(func: Callable[..., Any], *args: Any) -> WorkerCall | None:
    """Start ``func(*args)`` on a worker thread from blocking code; None when none is free.

    For work a blocking call fans out (a store syncing several files at once). None means
    every worker is busy: run ``func`` in the calling thread instead, so that a call waiting
    for the ones it started can never wait for a worker that waits for it.
    """
    started = WorkerCall(func, args)
    return started if _pool.submit(started._call, only_if_idle=True) else None


async def run_in_worker(func: Callable[..., T], *args: Any) -> T:
    """Return ``func(*args)`` run on one of the pool's worker threads.

    The semantics of ``anyio.to_thread.run_sync`` (with ``abandon_on_cancel=False``): a
    caller cancelled before the call is handed over raises at once; once handed over, the
    caller waits for the call to finish even when cancelled, then returns its result or
    raises its exception, and the cancellation takes effect at the caller's next checkpoint.
    Works under asyncio and trio.
    """
    await anyio.lowlevel.checkpoint_if_cancelled()
    call_soon = thread_safe_caller()
    trio = sys.modules.get("trio")
    if trio is not None and isinstance(
        getattr(call_soon, "__self__", None), trio.lowlevel.TrioToken
    ):
        # trio's own uncancellable wait, much cheaper than an Event in a shielded scope
        # (the cancellation stays pending for the next checkpoint, as with the shield).
        task = trio.lowlevel.current_task()
        call = _Call(func, args, call_soon, functools.partial(trio.lowlevel.reschedule, task))
        _pool.submit(call)
        await trio.lowlevel.wait_task_rescheduled(_refuse_abort)
    else:
        done = anyio.Event()
        call = _Call(func, args, call_soon, done.set)
        _pool.submit(call)
        with anyio.CancelScope(shield=True):
            await done.wait()
    if call.error is not None:
        error, call.error = call.error, None  # no reference cycle through the traceback
        raise error
    result: T = call.result
    return result


__all__ = [
    "IDLE_EXIT_S",
    "MAX_WORKERS",
    "WorkerCall",
    "run_in_worker",
    "start_in_worker",
    "submit_to_pool",
    "thread_safe_caller",
    "worker_counts",
]
