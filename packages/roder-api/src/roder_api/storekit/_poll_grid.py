"""One poll loop for every waiter of a store: ``wait_for_events`` without a wake-up per poll.

A server keeps a session open on each thread it answered lately, and each one's follower
waits for other processes' appends (``ThreadStore.wait_for_events``), which only a poll
finds. Polled by each waiter, every poll wakes its task, arms and fires a deadline and
reads (the reads of one pass share a worker call, :class:`~roder_api.storekit._polls.
CoalescedReads`): measured under ``openai_bench``, a tenth of ``roder serve``'s CPU went to
the polls of sessions that were only waiting to be closed.

:class:`PollGrid` keeps the waiters of a store in one schedule instead: each has its own
pauses (growing as before, due on the shared grid of times), and one of them, the leader,
wakes at each due time, reads every thread due with one call and wakes only the waiters
whose thread moved on. The others sleep until then, an append of this process (their
:class:`~roder_api._store_waits.AppendWakeups` waiter), or their deadline. When the leader's
own wait ends, the waiter due next takes the lead.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

from roder_api._store_waits import AppendWaiter, AppendWakeups
from roder_api.errors import RoderError, StoreError
from roder_api.storekit._polls import ReadMany


class _Poll:
    """One waiter's place in the schedule: its thread, what it waits past, its next pause,
    its AppendWakeups waiter, and a failure to raise (a read that failed)."""

    __slots__ = ("active", "after", "failure", "longest", "pause", "thread_id", "waiter")

    def __init__(
        self, thread_id: str, after: int, waiter: AppendWaiter, pauses: tuple[float, float]
    ) -> None:
        self.thread_id = thread_id
        self.after = after
        self.waiter = waiter
        self.pause, self.longest = pauses
        self.failure: Exception | None = None
        self.active = True

    @property
    def done(self) -> bool:
        return self.waiter.last > self.after or self.failure is not None


class _Grid:
    """The schedule of one event loop: due polls by time, the leader, when it wakes next."""

    __slots__ = ("heap", "leader", "order", "wake_at")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, _Poll]] = []
        self.leader: _Poll | None = None
        self.wake_at = math.inf
        self.order = itertools.count()


class PollGrid:
    """The waits of one store object (see the module's doc).

    ``read`` returns one thread's last sequence (the first read of a wait, and the last at
    its deadline); ``read_many`` those of many threads in one call (each due time's read).
    """

    def __init__(
        self,
        wakeups: AppendWakeups,
        read: Callable[[str], Awaitable[int]],
        read_many: ReadMany,
    ) -> None:
        self._wakeups = wakeups
        self._read = read
        self._read_many = read_many
        self._grids: dict[object, _Grid] = {}

    async def wait(
        self, thread_id: str, after: int, timeout_s: float, pauses: tuple[float, float]
    ) -> int:
        """Return the thread's last sequence once it is above ``after`` (an append here
        wakes it at once, a poll finds another process's), or after ``timeout_s``."""
        deadline = anyio.current_time() + max(0.0, timeout_s)
        waiter = self._wakeups.add(thread_id)  # before the read: an append after it wakes us
        try:
            last = await self._read(thread_id)
            if last > after or anyio.current_time() >= deadline:
                return last
            token = anyio.lowlevel.current_token()
            grid = self._grids.get(token)
            if grid is None:
                grid = self._grids[token] = _Grid()
            poll = _Poll(thread_id, after, waiter, pauses)
            self._schedule(grid, poll, anyio.current_time(), kick=True)
            try:
                while not poll.done:
                    if anyio.current_time() >= deadline:
                        return await self._read(thread_id)  # as a poll at the deadline
                    if grid.leader is None:
                        await self._lead(token, grid, poll, deadline)
                        continue
                    with anyio.CancelScope(deadline=deadline):
                        await waiter.event.wait()
                    if not poll.done:
                        waiter.event = anyio.Event()  # the lead handed over: look again
            finally:
                poll.active = False
            if poll.failure is not None:
                raise poll.failure
            return waiter.last
        finally:
            self._wakeups.discard(thread_id, waiter)

    def _schedule(self, grid: _Grid, poll: _Poll, now: float, *, kick: bool) -> None:
        # Due at the next multiple of its pause: the polls of one pause meet in one read.
        due = (math.floor(now / poll.pause) + 1) * poll.pause
        heapq.heappush(grid.heap, (due, next(grid.order), poll))
        if kick and grid.leader is not None and due < grid.wake_at:
            grid.leader.waiter.event.set()  # it sleeps past this poll: wake it to re-plan

    async def _lead(self, token: object, grid: _Grid, poll: _Poll, deadline: float) -> None:
        """Poll for every waiter of the grid until ``poll``'s own wait ends."""
        grid.leader = poll
        waiter = poll.waiter
        try:
            while not poll.done:
                now = anyio.current_time()
                if now >= deadline:
                    return
                if grid.heap and grid.heap[0][0] <= now:
                    await self._tick(grid, now)
                    continue
                grid.wake_at = min(grid.heap[0][0] if grid.heap else math.inf, deadline)
                with anyio.CancelScope(deadline=grid.wake_at):
                    await waiter.event.wait()
                if not poll.done:
                    waiter.event = anyio.Event()  # kicked: a poll due sooner was added
        finally:
            poll.active = False
            grid.leader = None
            grid.wake_at = math.inf
            self._hand_over(token, grid)

    def _hand_over(self, token: object, grid: _Grid) -> None:
        """Wake the waiter due next to lead (forget the grid when none is left)."""
        heap = grid.heap
        while heap and not heap[0][2].active:
            heapq.heappop(heap)
        if heap:
            heap[0][2].waiter.event.set()
        elif self._grids.get(token) is grid:
            del self._grids[token]

    async def _tick(self, grid: _Grid, now: float) -> None:
        """Read every thread due now in one call; wake the waiters it answers, reschedule
        the others with their next pause. Shielded: a leader cancelled meanwhile still
        answers the waiters it took out of the schedule."""
        due: list[_Poll] = []
        heap = grid.heap
        while heap and heap[0][0] <= now:
            poll = heapq.heappop(heap)[2]
            if poll.active:
                due.append(poll)
        if not due:
            return
        with anyio.CancelScope(shield=True):
            failure: Exception | None = None
            results: dict[str, int | Exception] = {}
            try:
                results = await self._read_many(sorted({poll.thread_id for poll in due}))
            except RoderError as exc:
                failure = exc  # as a read alone raises it (the store closed, a StoreError)
            except Exception as exc:  # noqa: BLE001 - every waiter of the read raises it
                failure = StoreError(f"reading the last sequence failed: {exc}")
                failure.__cause__ = exc
            now = anyio.current_time()
            for poll in due:
                if not poll.active:
                    continue  # its wait ended during the read
                result = failure or results.get(poll.thread_id)
                if result is None:
                    result = StoreError(f"the read of thread {poll.thread_id!r} returned nothing")
                if isinstance(result, Exception):
                    poll.failure = result
                    poll.waiter.event.set()
                elif result > poll.after:
                    poll.waiter.last = max(poll.waiter.last, result)
                    poll.waiter.event.set()
                else:
                    poll.pause = min(poll.pause * 2, poll.longest)
                    self._schedule(grid, poll, now, kick=False)
