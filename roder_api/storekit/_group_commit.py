"""Group commit: the writes that arrive while one is being made durable share the next sync.

A store whose commit ends in an expensive sync (``fdatasync``, a database ``COMMIT``) can
make many concurrent callers pay for one: the first caller becomes the *leader* and writes
what is queued in a worker thread; callers arriving meanwhile queue up and wait; when the
write returns, the leader writes everything that queued meanwhile as the next batch, and so
on until the queue is empty. Every caller returns only once its own item is written, so
each commit is as durable on return as if it had been written alone.

The primitive is generic over the write: ``write(items)`` is a blocking function that
commits a batch (to one thread or many) and returns one outcome per item, in order: the
item's result, or the exception that item's caller should raise (a sequence conflict that
refused one item must not fail the others). If ``write`` itself raises, every item of that
batch fails with that exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


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
    an exception to raise in that item's caller); it runs in a worker thread (on
    ``limiter`` when given), one batch at a time. :meth:`submit` queues an item and returns
    its result once the batch holding it is written.

    An object belongs to one event loop (the waiting is done with anyio events); create one
    per store and loop. The leader's write is shielded from cancellation, because the
    callers whose items are in its batch wait for it: a cancelled caller stops waiting, but
    its item may still be written.
    """

    def __init__(
        self,
        write: Callable[[list[ItemT]], Sequence[ResultT | BaseException]],
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self._write = write
        self._limiter = limiter
        self._forming: _Batch[ItemT, ResultT] | None = None
        self._leading = False
        self.batches = 0
        """How many batches have been written (for tests and benchmarks)."""

    async def submit(self, item: ItemT) -> ResultT:
        """Queue ``item`` for the next batch; return its outcome once the batch is written."""
        batch = self._forming
        if batch is None:
            batch = self._forming = _Batch()
        index = len(batch.items)
        batch.items.append(item)
        if self._leading:
            await batch.done.wait()
        else:
            await self._lead()
        outcome = batch.outcomes[index]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _lead(self) -> None:
        """Write batches until none is queued: items arriving meanwhile share a write."""
        self._leading = True
        try:
            # Shielded: the callers of a batch wait for it, whatever happens to the leader.
            with anyio.CancelScope(shield=True):
                while self._forming is not None:
                    # Let the tasks that are ready (often the ones the last batch woke) add
                    # their items first; otherwise batches alternate between 1 and n-1.
                    await anyio.lowlevel.checkpoint()
                    batch, self._forming = self._forming, None
                    assert batch is not None
                    try:
                        outcomes = await anyio.to_thread.run_sync(
                            self._write, batch.items, limiter=self._limiter
                        )
                        if len(outcomes) != len(batch.items):
                            raise RuntimeError(
                                f"a group commit's write returned {len(outcomes)} outcomes "
                                f"for {len(batch.items)} items"
                            )
                    except BaseException as exc:  # every caller of the batch learns of it
                        outcomes = [exc] * len(batch.items)
                    batch.outcomes = outcomes
                    self.batches += 1
                    batch.done.set()
        finally:
            self._leading = False
