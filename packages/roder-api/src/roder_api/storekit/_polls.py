"""Coalesced polls: the last-sequence reads of many waiters answered by one worker call.

``ThreadStore.wait_for_events`` polls a thread's metadata for appends by other processes.
A server keeps a session open on each thread it answered lately, and each one's follower
polls: one worker call per poll each is a thread hand-off per session per poll, which a
busy server pays on its event loop while it streams other responses. The kit's stores
(:class:`~roder_api.storekit.BlockingThreadStore`) answer instead every read made in the same
pass of the event loop with one worker call (``last_sequences_sync``): a wait's first
read, and the reads of other callers. Its later polls are made for every waiter at once
(:mod:`roder_api.storekit._poll_grid`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel

from roder_api.errors import RoderError, StoreError

ReadMany = Callable[[Sequence[str]], Awaitable[dict[str, int | Exception]]]
"""Read the last sequences of threads in one call: a number, or the exception of one."""


class _Batch:
    """The polls of one pass of the event loop: their thread ids, then their answers."""

    __slots__ = ("done", "failure", "ids", "results")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.done = anyio.Event()
        self.results: dict[str, int | Exception] = {}
        self.failure: Exception | None = None


class CoalescedReads:
    """Last-sequence reads that share one :data:`ReadMany` call when made at once.

    The first read of a pass of the event loop leads: it lets the others made in the same
    pass join (one checkpoint), closes the batch and reads every thread in it with one
    call, shielded, so that the reads that joined always get their answer; a read made
    meanwhile starts the next batch. Batches belong to the event loop they were made in.
    """

    def __init__(self, read_many: ReadMany) -> None:
        self._read_many = read_many
        self._open: dict[object, _Batch] = {}

    async def last_sequence(self, thread_id: str) -> int:
        """Return the thread's last sequence (raise what reading it raised)."""
        token = anyio.lowlevel.current_token()
        batch = self._open.get(token)
        if batch is None:
            batch = self._open[token] = _Batch()
            batch.ids.add(thread_id)
            await self._lead(token, batch)
        else:
            batch.ids.add(thread_id)
            await batch.done.wait()
        failure = batch.failure
        if isinstance(failure, RoderError):
            raise failure  # as the read alone raised it (the store closed, a StoreError)
        if failure is not None:
            raise StoreError(f"reading the last sequence failed: {failure}") from failure
        result = batch.results.get(thread_id)
        if isinstance(result, Exception):
            raise result
        if result is None:
            raise StoreError(f"the read of thread {thread_id!r} returned nothing")
        return result

    async def _lead(self, token: object, batch: _Batch) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.lowlevel.checkpoint()  # the other reads of this pass join
                if self._open.get(token) is batch:
                    del self._open[token]  # closed: a read from now on starts the next
                batch.results = await self._read_many(sorted(batch.ids))
            except Exception as exc:  # noqa: BLE001 - every read of the batch raises it
                batch.failure = exc
            finally:
                batch.done.set()
