"""``BlockingThreadStore``: the async facade of a store whose work is blocking code.

A subclass writes the blocking methods (``create_sync``, ``append_sync``, ...): plain
functions that talk to a database driver or to files. The facade validates ids and
arguments on the event loop, serialises events before any blocking work starts, and runs
the blocking methods on the store kit's process-wide worker threads
(:func:`~roder_api.storekit.run_in_worker`, cheaper per call than ``anyio.to_thread``), at
most as many at once as the store's own :class:`anyio.CapacityLimiter` allows
(:attr:`BlockingThreadStore.limiter`), so a busy store never takes every thread from the
rest of the program.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar, TypeVar

import anyio

from roder_api._thread_contract import (
    UNSET,
    EventPage,
    LeasedThread,
    LeaseHolder,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    ThreadStore,
    TurnFold,
    validate_thread_id,
)
from roder_api.codec import check_value, dumps_each
from roder_api.errors import StoppedError
from roder_api.events import Event, JournalEvent
from roder_api.storekit._checks import (
    check_consecutive,
    check_expected,
    metadata_changes,
    validate_expected,
)
from roder_api.storekit._encoded import payloads_of
from roder_api.storekit._file_leases import FileLeases
from roder_api.storekit._follow_on import FollowOn
from roder_api.storekit._poll_grid import PollGrid
from roder_api.storekit._polls import CoalescedReads
from roder_api.storekit._workers import run_in_worker

T = TypeVar("T")


class BlockingThreadStore(ThreadStore):
    """A thread store whose work is blocking code (a database driver, file I/O).

    Subclasses implement the blocking methods below (``*_sync``; each runs in a worker
    thread and may block) and may override the hooks :meth:`translate_error`,
    :meth:`submit_append` and :meth:`close_sync`. Everything else — id and argument
    checks, serialising events (``roder_api.codec.dumps_each``, or the bytes an
    :class:`~roder_api.storekit.EncodedEvents` batch carries) before any blocking work,
    :class:`StoppedError` once closed, the worker threads — is done here, for every
    ``ThreadStore`` method. The SQLite and PostgreSQL stores are built this way.

    ``max_threads`` bounds the worker threads the store uses at once (its own
    :attr:`limiter`). ``store_name`` names the store in messages.
    """

    max_threads: ClassVar[int] = 8
    """How many worker threads one store object uses at most."""

    store_name: ClassVar[str] = "thread store"
    """How messages name the store (``"the SQLite thread store is closed"``)."""

    closed: bool = False
    """True once :meth:`aclose` was called; every method then raises ``StoppedError``."""

    _limiter: anyio.CapacityLimiter | None = None
    _polls: CoalescedReads | None = None
    _grid: PollGrid | None = None

    # --- hooks ----------------------------------------------------------------------------

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """Return the store's own capacity limiter (``max_threads`` worker threads).

        Created on first use, in the event loop the store is used from.
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_threads)
        return self._limiter

    def translate_error(self, exc: Exception) -> Exception | None:
        """Return the ``StoreError`` to raise for a driver error, or None to let it through.

        Called with every exception a blocking method raises that is not a ``RoderError``
        (for example ``sqlite3.Error``); the default lets everything through.
        """
        return None

    def check_open(self) -> None:
        """Raise ``StoppedError`` once the store is closed."""
        if self.closed:
            raise StoppedError(f"the {self.store_name} is closed; open a new one")

    async def run_sync(self, func: Callable[..., T], *args: Any) -> T:
        """Return ``func(*args)`` run in a worker thread, holding a token of :attr:`limiter`.

        The thread is one of the store kit's shared pool (:func:`run_in_worker`, the
        semantics of ``anyio.to_thread.run_sync``: once handed over, the call finishes even
        if the caller is cancelled). Raise ``StoppedError`` once closed; driver errors go
        through :meth:`translate_error`.
        """
        self.check_open()
        limiter = self.limiter
        try:
            limiter.acquire_nowait()
        except anyio.WouldBlock:
            await limiter.acquire()
        try:
            return await run_in_worker(func, *args)
        except Exception as exc:
            translated = self.translate_error(exc)
            if translated is None:
                raise
            raise translated from exc
        finally:
            limiter.release()

    async def submit_append(
        self,
        thread_id: str,
        events: list[Event],
        payloads: list[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Commit one checked, serialised batch; the default runs :meth:`append_sync`.

        Override it to group concurrent appends into one commit
        (``roder_api.storekit.GroupCommit``).
        """
        return await self.run_sync(
            self.append_sync, thread_id, events, payloads, expected_last_sequence
        )

    def close_sync(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release the store's connections or files (runs once, in a worker thread)."""

    # --- the blocking methods -------------------------------------------------------------

    @abstractmethod
    def create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create the thread (``ThreadExistsError`` when taken); return what is stored.

        Store title, extra and times; usage, counts and ``last_sequence`` start at zero.
        """

    def create_with_events_sync(
        self, metadata: ThreadMetadata, events: Sequence[Event], payloads: Sequence[bytes]
    ) -> list[JournalEvent]:
        """Create the thread and append its first events (never empty); return them.

        The default runs :meth:`create_sync`, then :meth:`append_sync`: one worker call, two
        writes (a crash between them leaves the thread without its events). Override it to
        make them one write, as the relational stores (one transaction) and the JSONL store
        (one file, one sync) do.
        """
        self.create_sync(metadata)
        return self.append_sync(metadata.thread_id, events, payloads, None)

    def create_with_follow_on_sync(
        self,
        metadata: ThreadMetadata,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        follow_on: FollowOn,
    ) -> list[JournalEvent]:
        """:meth:`create_with_events_sync` in :meth:`lease_new_thread`'s worker call: a
        store may also journal, in the create's own syncs, what ``follow_on`` is offered
        meanwhile (``take``, never ``close``; its entries after ``events``'), as the JSONL
        store does once the journal is linked, before its directory's sync. The default
        journals none of it: the kit appends what came once this returns."""
        return self.create_with_events_sync(metadata, events, payloads)

    @abstractmethod
    def get_sync(self, thread_id: str) -> ThreadMetadata:
        """Return the thread's metadata (``ThreadNotFoundError`` when absent)."""

    @abstractmethod
    def update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        """Apply :func:`metadata_changes` output (never empty); return the new metadata."""

    @abstractmethod
    def append_sync(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Append one atomic, durable batch (``payloads``: each event's JSON bytes).

        In the same transaction as the write, call :func:`check_expected` with the
        thread's last sequence (a conditional append when ``expected_last_sequence`` is set).
        """

    @abstractmethod
    def import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Append journal events verbatim; ``SequenceConflictError`` unless they continue.

        ``entries`` are consecutive (checked already); :func:`check_continues` checks the
        first against the thread's last sequence.
        """

    @abstractmethod
    def read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        """Return events above ``after`` (from the last boundary on when ``replay``)."""

    @abstractmethod
    def page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        """Return the :meth:`ThreadStore.event_page` answer (``limit`` is at least 1)."""

    @abstractmethod
    def list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        """Return the :meth:`ThreadStore.list_threads` answer (``limit`` is at least 1)."""

    @abstractmethod
    def delete_sync(self, thread_id: str) -> None:
        """Delete the thread (``ThreadNotFoundError`` when absent)."""

    def size_sync(self, thread_id: str) -> int | None:
        """Return the bytes the thread takes, or None when unknown (the default)."""
        self.get_sync(thread_id)
        return None

    def snapshot_sync(self, thread_id: str) -> ThreadSnapshot:
        """Return the :meth:`ThreadStore.read_snapshot` answer, in one worker-thread call.

        The default reads :attr:`snapshot_chunk` events at a time with :meth:`read_sync`,
        folds them (``TurnFold``) and then reads the metadata with :meth:`get_sync`; a store
        that can decode transcript items straight from its rows or lines overrides it.
        """
        fold = TurnFold()
        after = 0
        while True:
            events = self.read_sync(thread_id, after, self.snapshot_chunk, False)
            fold.add_events(events)
            if len(events) < self.snapshot_chunk:
                break
            after = events[-1].sequence
        return ThreadSnapshot(self.get_sync(thread_id), fold.turns())

    def last_sequences_sync(self, thread_ids: Sequence[str]) -> dict[str, int | Exception]:
        """Return each thread's last sequence, or the exception reading it raised.

        The polls of :meth:`wait_for_events` made at once, read in one worker call; the
        default asks :meth:`get_sync` for each (a store can answer with one query).
        """
        found: dict[str, int | Exception] = {}
        for thread_id in thread_ids:
            try:
                found[thread_id] = self.get_sync(thread_id).last_sequence
            except Exception as exc:  # noqa: BLE001 - this thread's poll raises it
                found[thread_id] = self.translate_error(exc) or exc
        return found

    async def read_last_sequence(self, thread_id: str) -> int:
        """Return the thread's last sequence: what :meth:`wait_for_events` polls, read
        together with the polls of other threads made at once (one worker call)."""
        if self._polls is None:
            self._polls = CoalescedReads(
                lambda thread_ids: self.run_sync(self.last_sequences_sync, thread_ids)
            )
        return await self._polls.last_sequence(thread_id)

    # --- the ThreadStore methods ----------------------------------------------------------

    async def wait_for_events(self, thread_id: str, after_sequence: int, timeout_s: float) -> int:
        """Return the thread's last sequence once it is above ``after_sequence``, or after
        ``timeout_s`` (see :meth:`ThreadStore.wait_for_events`): woken at once by this
        store's appends in this event loop; other processes' appends are polled for every
        waiter at once (:class:`~roder_api.storekit._poll_grid.PollGrid`: one task wakes
        at each due time and reads every thread due with one worker call)."""
        validate_thread_id(thread_id)
        if self._grid is None:
            self._grid = PollGrid(
                self.append_wakeups,
                lambda thread_id: self.read_last_sequence(thread_id),
                lambda thread_ids: self.run_sync(self.last_sequences_sync, thread_ids),
            )
        return await self._grid.wait(thread_id, after_sequence, timeout_s, self.wait_poll_s)

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread; raise ``ThreadExistsError`` when the id is taken."""
        validate_thread_id(metadata.thread_id)
        return await self.run_sync(self.create_sync, metadata)

    async def create_thread_with_events(
        self, metadata: ThreadMetadata, events: Sequence[Event]
    ) -> list[JournalEvent]:
        """Create a thread with its first events in one worker call
        (:meth:`create_with_events_sync`); ``ThreadExistsError`` when the id is taken."""
        validate_thread_id(metadata.thread_id)
        if not events:
            await self.create_thread(metadata)
            return []
        payloads = payloads_of(events)  # the value rule, before anything is written
        entries = await self.run_sync(self.create_with_events_sync, metadata, events, payloads)
        self.notify_appended(metadata.thread_id, entries[-1].sequence, entries)
        return entries

    def file_leases(self) -> FileLeases | None:
        """Return the store's :class:`FileLeases` when its :meth:`lease` is theirs (the JSONL
        and SQLite stores), so that :meth:`lease_new_thread` takes a new thread's lease in
        the create's worker call; None (the default, or a store opened read-only): the
        lease is taken on its own first."""
        return None

    def lease_new_thread(
        self,
        metadata: ThreadMetadata,
        events: Sequence[Event],
        *,
        owner: str,
        follow_on: FollowOn | None = None,
    ) -> AbstractAsyncContextManager[LeasedThread]:
        """Take a new thread's lease and create it with ``events`` (see
        :meth:`ThreadStore.lease_new_thread`): with :meth:`file_leases`, both in one worker
        call (one hand-off to a worker thread and back, where two took two).

        ``follow_on`` (that one-call path only; closed at once otherwise): what is offered
        to it until the create is done is journaled in the same worker call, after
        ``events`` (see :meth:`create_with_follow_on_sync`, ``FollowOn.finish``), and is in
        ``LeasedThread.entries``; it is closed before the call returns. When that fails,
        ``follow_on.error`` says why: the lease and the thread as made stand.
        """
        leases = self.file_leases()
        if leases is None or not events:
            if follow_on is not None:
                follow_on.close()
            return super().lease_new_thread(metadata, events, owner=owner)
        validate_thread_id(metadata.thread_id)
        return self._lease_and_create(leases, metadata, events, owner, follow_on)

    @asynccontextmanager
    async def _lease_and_create(
        self,
        leases: FileLeases,
        metadata: ThreadMetadata,
        events: Sequence[Event],
        owner: str,
        follow_on: FollowOn | None,
    ) -> AsyncIterator[LeasedThread]:
        thread_id, holder = metadata.thread_id, LeaseHolder.current(owner)
        payloads = payloads_of(events)  # the value rule, before anything is written

        def lease_and_create() -> tuple[int, list[JournalEvent]]:
            fd = leases.acquire_sync(thread_id, holder)
            try:
                if follow_on is None:
                    entries = self.create_with_events_sync(metadata, events, payloads)
                else:
                    more, more_bytes = follow_on.take()  # they join the create's write
                    made, bytes_ = [*events, *more], [*payloads, *more_bytes]
                    entries = self.create_with_follow_on_sync(metadata, made, bytes_, follow_on)
            except BaseException:
                leases.release_sync(fd)
                raise
            if follow_on is not None:
                entries += follow_on.finish(
                    lambda later, data: self.append_sync(thread_id, later, data, None)
                )
            return fd, entries

        try:
            with anyio.CancelScope(shield=True):  # a lease taken is never lost to a cancellation
                fd, entries = await self.run_sync(lease_and_create)
        finally:
            if follow_on is not None:
                follow_on.close()  # whatever happened, later offers go the usual way
        self.notify_appended(thread_id, entries[-1].sequence, entries)
        try:
            yield LeasedThread(ThreadLease(thread_id, holder), entries)
        finally:
            await leases.release(fd)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata."""
        validate_thread_id(thread_id)
        return await self.run_sync(self.get_sync, thread_id)

    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata."""
        validate_thread_id(thread_id)
        changes = metadata_changes(title, extra)
        if not changes:
            return await self.get_thread(thread_id)
        check_value(changes, what="the thread's new metadata")
        return await self.run_sync(self.update_sync, thread_id, changes)

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append ``events`` as one atomic, durable batch (conditionally, when expected)."""
        validate_thread_id(thread_id)
        expected = validate_expected(expected_last_sequence)
        if not events:
            if expected is not None:
                check_expected(
                    thread_id, expected, (await self.get_thread(thread_id)).last_sequence
                )
            return []
        payloads = payloads_of(events)  # the recorder's bytes when it made them
        self.check_open()
        entries = await self.submit_append(thread_id, list(events), payloads, expected)
        if entries:
            self.notify_appended(thread_id, entries[-1].sequence, entries)
        return entries

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim, atomically."""
        validate_thread_id(thread_id)
        if not entries:
            await self.get_thread(thread_id)
            return
        check_consecutive(thread_id, entries)
        payloads = dumps_each([entry.event for entry in entries])
        await self.run_sync(self.import_sync, thread_id, list(entries), payloads)
        self.notify_appended(thread_id, entries[-1].sequence, entries)

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the events with sequence above ``after``, in order."""
        validate_thread_id(thread_id)
        return await self.run_sync(self.read_sync, thread_id, after, limit, False)

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return up to ``limit`` events below ``before`` (newest when None), ascending."""
        validate_thread_id(thread_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self.run_sync(self.page_sync, thread_id, before, limit)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last compaction boundary on."""
        validate_thread_id(thread_id)
        return await self.run_sync(self.read_sync, thread_id, 0, None, True)

    async def read_snapshot(self, thread_id: str) -> ThreadSnapshot:
        """Return the thread's metadata and items by turn (:meth:`snapshot_sync`, one call)."""
        validate_thread_id(thread_id)
        return await self.run_sync(self.snapshot_sync, thread_id)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self.run_sync(self.list_sync, cursor, limit)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread and its journal."""
        validate_thread_id(thread_id)
        await self.run_sync(self.delete_sync, thread_id)

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the bytes the thread takes in the store, or None when unknown."""
        validate_thread_id(thread_id)
        return await self.run_sync(self.size_sync, thread_id)

    async def aclose(self) -> None:
        """Close the store: later calls raise ``StoppedError``; then run :meth:`close_sync`."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            async with self.limiter:
                await run_in_worker(self.close_sync)


__all__ = ["BlockingThreadStore"]
