"""Group commit: the writes that arrive while one is being made durable share the next sync.

A store whose commit ends in an expensive sync (``fdatasync``, a database ``COMMIT``) can
make many concurrent callers pay for one: callers queue their items on the event loop; a
worker thread writes what is queued as one batch; callers arriving meanwhile queue up for
the next batch, which is handed over as soon as the previous one is written, and so on
until the queue is empty. Every caller returns only once its own item is written, so each
commit is as durable on return as if it had been written alone.

The batches run on the store kit's one pool of worker threads (``run_in_worker``'s), one
batch of a :class:`GroupCommit` at a time: the event loop hands a batch over with one
queue put and the worker hands the outcomes back with the event loop's own thread-safe
"call soon" (asyncio's ``call_soon_threadsafe``, trio's ``TrioToken.run_sync_soon``): one
thread wake-up each way per batch and no per-call bookkeeping, which is most of what a
single durable append costs besides its sync.

The primitive is generic over the write: ``write(items)`` is a blocking function that
commits a batch (to one thread or many) and returns one outcome per item, in order: the
item's result, or the exception that item's caller should raise (a sequence conflict that
refused one item must not fail the others). If ``write`` itself raises, every item of that
batch fails with that exception.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel

from roder_api.errors import StoppedError
from roder_api.storekit._workers import submit_to_pool, thread_safe_caller

log = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


def _asyncio_event() -> Callable[[], _Event]:
    event: Callable[[], _Event] = sys.modules["asyncio"].Event
    return event


def _loop_call_soon(
    call_soon: Callable[[Callable[[], object]], object],
) -> Callable[[Callable[[], object]], object] | None:
    """Return the asyncio loop's own ``call_soon`` behind its thread-safe one (no wake-up
    write), or None on another event loop (trio)."""
    asyncio = sys.modules.get("asyncio")
    loop = getattr(call_soon, "__self__", None)
    if asyncio is not None and isinstance(loop, asyncio.AbstractEventLoop):
        later: Callable[[Callable[[], object]], object] = loop.call_soon
        return later
    return None


class _Event(Protocol):
    """What a batch's callers wait on: ``anyio.Event``, or asyncio's own (a cheaper make)."""

    def set(self) -> object: ...

    def wait(self) -> Awaitable[object]: ...


class _Batch(Generic[ItemT, ResultT]):
    """The items queued for one write, and their outcomes once it is done."""

    __slots__ = ("done", "items", "outcomes")

    def __init__(self, done: _Event) -> None:
        self.items: list[ItemT] = []
        self.outcomes: Sequence[ResultT | BaseException] = ()
        self.done = done


class GroupCommit(Generic[ItemT, ResultT]):
    """Batches concurrent commits so that they share one blocking write-and-sync.

    ``write`` takes the items of one batch and returns one outcome per item (a result, or
    an exception to raise in that item's caller); it runs on the committer thread, one
    batch at a time, on a worker thread (see the module docstring). :meth:`submit` queues an
    item and returns its result once the batch holding it is written.

    ``after``, when given, runs on the worker thread right after the callers of each batch
    are woken (its exceptions are logged, never raised): work the callers need not wait
    for, such as updating a cache of what the batch wrote. It may overlap the next batch.

    ``limiter`` is deprecated and ignored (a ``DeprecationWarning`` says so when it is
    given): one batch at a time is all a group commit ever runs.

    An object belongs to one event loop (the waiting is done with anyio events); create one
    per store and loop. A batch handed to the committer is written whatever happens to its
    callers: a cancelled caller stops waiting, but its item may still be written.
    """

    def __init__(
        self,
        write: Callable[[list[ItemT]], Sequence[ResultT | BaseException]],
        *,
        limiter: anyio.CapacityLimiter | None = None,
        after: Callable[[], object] | None = None,
    ) -> None:
        if limiter is not None:
            warnings.warn(
                "GroupCommit(limiter=...) is ignored (one batch runs at a time) and will be "
                "removed; stop passing it",
                DeprecationWarning,
                stacklevel=2,
            )
        self._write = write
        self._after = after
        self._forming: _Batch[ItemT, ResultT] | None = None
        self._busy = False  # a batch is with the committer (event loop side only)
        self._in_flight: _Batch[ItemT, ResultT] | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        self._later: Callable[[Callable[[], object]], object] | None = None
        self._new_event: Callable[[], _Event] = anyio.Event
        self._lock = threading.Lock()
        self._idle = threading.Event()  # set while no batch is with a worker thread
        self._idle.set()
        self._running = 0  # batches with a worker thread, ``after`` included (under _lock)
        self._closed = False
        self._lone = False  # the last batch written held one item (event loop side only)
        self.batches = 0
        """How many batches have been written (for tests and benchmarks)."""

    async def submit(self, item: ItemT) -> ResultT:
        """Queue ``item`` for the next batch; return its outcome once the batch is written."""
        call_soon = thread_safe_caller()
        if call_soon != self._call_soon:
            # Another event loop than the last one: what the last one left (a batch being
            # written whose wake-up it can no longer receive, one forming) is not ours.
            self._call_soon, self._forming, self._busy = call_soon, None, False
            self._in_flight = None
            self._later = _loop_call_soon(call_soon)
            self._new_event = anyio.Event if self._later is None else _asyncio_event()
        batch = self._forming
        if batch is None:
            batch = self._forming = _Batch(self._new_event())
        index = len(batch.items)
        batch.items.append(item)
        if index == 0 and not self._busy:
            # Let the tasks that are ready add their items first; otherwise batches
            # alternate between 1 and n-1. On asyncio a callback queued behind them hands
            # the batch over (whatever happens to this caller) without a task switch;
            # elsewhere this caller yields once, shielded: the batch must be handed over.
            # After a batch of one (appends awaited one at a time) it goes at once: no
            # loop pass, and a burst that follows waits for one batch at most.
            if self._lone:
                self._hand_over()
            elif self._later is not None:
                self._later(functools.partial(self._hand_over_if_forming, batch))
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.lowlevel.checkpoint()
                self._hand_over_if_forming(batch)
        await batch.done.wait()
        outcome = batch.outcomes[index]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self, timeout: float = 30.0) -> None:
        """Refuse new batches and wait (up to ``timeout`` s) until the one handed over is
        written (blocking; idempotent)."""
        with self._lock:
            self._closed = True
        self._idle.wait(timeout)

    # --- the event loop side --------------------------------------------------------------

    def _hand_over_if_forming(self, batch: _Batch[ItemT, ResultT]) -> None:
        """Hand ``batch`` over unless it was already (or one is with the committer)."""
        if not self._busy and self._forming is batch:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the forming batch to the committer thread (on the event loop thread)."""
        batch, self._forming = self._forming, None
        assert batch is not None
        self._busy = True
        call_soon = self._call_soon
        assert call_soon is not None
        with self._lock:
            if self._closed:
                self._busy = False
                closed = StoppedError("the group commit is closed; open a new store")
                batch.outcomes = [closed] * len(batch.items)
                batch.done.set()
                return
            self._in_flight = batch
            self._running += 1
            self._idle.clear()
        try:
            # The committer wakes the callers itself (then runs ``after``): no report.
            submit_to_pool(functools.partial(self._run, batch, call_soon), call_soon, None)
        except BaseException as exc:  # no worker could be started: fail this batch only
            self._finished()
            self._in_flight = None
            self._busy = False
            batch.outcomes = [exc] * len(batch.items)
            batch.done.set()

    def _written(self, batch: _Batch[ItemT, ResultT]) -> None:
        """Wake the callers of a written batch; hand over the next (on the event loop)."""
        self.batches += 1
        self._lone = len(batch.items) == 1
        batch.done.set()
        if self._in_flight is not batch:
            return  # handed over on an event loop that is gone; this one did not wait
        self._in_flight = None
        self._busy = False
        if self._forming is not None:
            self._hand_over()

    # --- the committer thread -------------------------------------------------------------

    def _outcomes(self, items: list[ItemT]) -> Sequence[ResultT | BaseException]:
        try:
            outcomes = self._write(items)
            if len(outcomes) != len(items):
                raise RuntimeError(
                    f"a group commit's write returned {len(outcomes)} outcomes "
                    f"for {len(items)} items"
                )
        except BaseException as exc:  # every caller of the batch learns of it
            outcomes = [exc] * len(items)
        return outcomes

    def _run(
        self, batch: _Batch[ItemT, ResultT], call_soon: Callable[[Callable[[], object]], object]
    ) -> None:
        try:
            try:
                batch.outcomes = self._outcomes(batch.items)
            finally:
                try:
                    call_soon(functools.partial(self._written, batch))
                except RuntimeError:
                    pass  # that event loop is closed: nobody waits for this batch any more
            if self._after is not None:
                try:
                    self._after()
                except Exception:
                    log.exception("a group commit's after-batch call failed")
        finally:
            self._finished()

    def _finished(self) -> None:
        """A batch is done with its worker thread (``after`` included): idle when the last."""
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._idle.set()
