"""Group commit: the writes that arrive while one is being made durable share the next sync.

A store whose commit ends in an expensive sync (``fdatasync``, a database ``COMMIT``) can
make many concurrent callers pay for one: callers queue their items on the event loop; one
*committer thread* writes what is queued as one batch; callers arriving meanwhile queue up
for the next batch, which the committer takes as soon as the previous one is written, and
so on until the queue is empty. Every caller returns only once its own item is written, so
each commit is as durable on return as if it had been written alone.

The committer is one dedicated thread per :class:`GroupCommit` (started on first use, gone
after :data:`IDLE_EXIT_S` idle seconds or :meth:`GroupCommit.close`). The event loop hands
it a batch through a ``queue.SimpleQueue`` and the committer hands the outcomes back with
the event loop's own thread-safe "call soon" (asyncio's ``call_soon_threadsafe``, trio's
``TrioToken.run_sync_soon``): one thread wake-up each way per batch and no per-call
thread-pool bookkeeping, which is most of what a single durable append costs besides its
sync.

The primitive is generic over the write: ``write(items)`` is a blocking function that
commits a batch (to one thread or many) and returns one outcome per item, in order: the
item's result, or the exception that item's caller should raise (a sequence conflict that
refused one item must not fail the others). If ``write`` itself raises, every item of that
batch fails with that exception.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

from roder_api.errors import StoppedError
from roder_api.storekit._workers import thread_safe_caller

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

IDLE_EXIT_S = 10.0
"""How long the committer thread waits for a batch before it ends (a new one starts when
work arrives again)."""

_STOP = object()


class _Batch(Generic[ItemT, ResultT]):
    """The items queued for one write, and their outcomes once it is done."""

    __slots__ = ("done", "items", "outcomes")

    def __init__(self) -> None:
        self.items: list[ItemT] = []
        self.outcomes: Sequence[ResultT | BaseException] = ()
        self.done = anyio.Event()


class GroupCommit(Generic[ItemT, ResultT]):
    """Batches concurrent commits so that they share one blocking write-and-sync.

    ``write`` takes the items of one batch and returns one outcome per item (a result, or
    an exception to raise in that item's caller); it runs on the committer thread, one
    batch at a time (see the module docstring). :meth:`submit` queues an item and returns
    its result once the batch holding it is written. ``limiter`` is accepted for the
    callers written before the committer thread and ignored: the committer is one thread
    of its own, not one of a pool.

    An object belongs to one event loop (the waiting is done with anyio events); create one
    per store and loop. A batch handed to the committer is written whatever happens to its
    callers: a cancelled caller stops waiting, but its item may still be written.
    """

    def __init__(
        self,
        write: Callable[[list[ItemT]], Sequence[ResultT | BaseException]],
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        del limiter  # see the class docstring
        self._write = write
        self._forming: _Batch[ItemT, ResultT] | None = None
        self._busy = False  # a batch is with the committer (event loop side only)
        self._in_flight: _Batch[ItemT, ResultT] | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        # Batches with the event loop's "call soon" to wake their callers with; or _STOP.
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._closed = False
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
        batch = self._forming
        if batch is None:
            batch = self._forming = _Batch()
        index = len(batch.items)
        batch.items.append(item)
        if index == 0 and not self._busy:
            # Let the tasks that are ready add their items first; otherwise batches
            # alternate between 1 and n-1. Shielded: the batch must be handed over.
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
            if not self._busy and self._forming is batch:
                self._hand_over()
        await batch.done.wait()
        outcome = batch.outcomes[index]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self, timeout: float = 30.0) -> None:
        """Let the committer write what it was handed, then end it (blocking; idempotent)."""
        with self._thread_lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- the event loop side --------------------------------------------------------------

    def _hand_over(self) -> None:
        """Give the forming batch to the committer thread (on the event loop thread)."""
        batch, self._forming = self._forming, None
        assert batch is not None
        self._busy = True
        call_soon = self._call_soon
        assert call_soon is not None
        with self._thread_lock:
            if self._closed:
                self._busy = False
                closed = StoppedError("the group commit is closed; open a new store")
                batch.outcomes = [closed] * len(batch.items)
                batch.done.set()
                return
            self._in_flight = batch
            self._queue.put((batch, call_soon))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="roder-group-commit", daemon=True
                )
                self._thread.start()

    def _written(self, batch: _Batch[ItemT, ResultT]) -> None:
        """Wake the callers of a written batch; hand over the next (on the event loop)."""
        self.batches += 1
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

    def _run(self) -> None:
        while True:
            try:
                work = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._thread_lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if work is _STOP:
                with self._thread_lock:
                    self._thread = None
                return
            batch: _Batch[ItemT, ResultT]
            call_soon: Callable[[Callable[[], object]], object]
            batch, call_soon = work  # type: ignore[misc]
            batch.outcomes = self._outcomes(batch.items)
            try:
                call_soon(functools.partial(self._written, batch))
            except RuntimeError:
                pass  # that event loop is closed: nobody waits for the batch any more
