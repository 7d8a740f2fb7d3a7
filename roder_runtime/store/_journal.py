"""A thread-bound journal: what sessions, turns and compaction see of the thread store.

:class:`ThreadJournal` appends to one thread (conditionally when asked), reads its replay
and takes a mark (the last sequence) — nothing else of the store, and every call has a
deadline, so a store that stops answering fails the caller with an error naming the store
instead of hanging it. :class:`Journal` is the protocol the turn driver and compaction take:
a session hands them its recorder-backed journal, a script the store-backed one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import anyio

from roder_api.codec import gc_paused
from roder_api.errors import StoreError
from roder_api.events import Event, ItemCompleted, JournalEvent
from roder_api.storekit import BlockingThreadStore, FollowOn
from roder_api.threads import (
    EventPage,
    LeasedThread,
    ThreadMetadata,
    ThreadSnapshot,
    ThreadStore,
)
from roder_api.transcript import TranscriptItem, trim_to_last_compaction_boundary

T = TypeVar("T")

DEFAULT_STORE_TIMEOUT_S = 120.0
"""How long one store call may take when ``turn_timeout_s`` is not set."""

TAIL_FRESH_S = 0.05
"""How long after :meth:`ThreadJournal.read_events` read the journal's end a replay may
use that read instead of reading again (when nothing was appended through it since)."""

_KIT_LEASE_NEW = BlockingThreadStore.lease_new_thread
"""The store kit's ``lease_new_thread``, the one that takes a ``follow_on``."""


def store_label(factory: object) -> str:
    """Return what deadline errors call the store a factory opens (``thread store 'jsonl'``)."""
    return f"thread store {getattr(factory, 'id', '?')!r}"


async def bounded_call(
    what: str, call: Callable[[], Awaitable[T]], *, store_name: str, timeout_s: float | None
) -> T:
    """Return ``await call()``; raise ``StoreError`` naming the store when it is late.

    The one deadline of the runtime's store calls (``turn_timeout_s``, else
    :data:`DEFAULT_STORE_TIMEOUT_S`): ``what`` says which call did not answer. The store
    call is cancelled (a blocking driver call in a worker thread ends when it returns).
    ``timeout_s`` None is the default.
    """
    if timeout_s is None:
        timeout_s = DEFAULT_STORE_TIMEOUT_S
    with anyio.move_on_after(timeout_s) as scope:
        return await call()
    assert scope.cancelled_caught
    raise late_error(store_name, timeout_s, what)


def late_error(store_name: str, timeout_s: float, what: str) -> StoreError:
    """Return the error of a store call (``what``) that did not answer within ``timeout_s``."""
    return StoreError(
        f"{store_name} did not answer within {timeout_s:g} s ({what}); check the store "
        "(disk, database, network) and try again"
    )


class ReplayHistory(list[TranscriptItem]):
    """The transcript items from the last compaction boundary on, as read at ``sequence``.

    A list (use it as one); ``sequence`` is the thread's last event when it was read (0:
    none). ``Runtime.compact_with_provider`` commits only if no item was journaled after
    it, so an item appended between the read and the compaction is never hidden.
    """

    __slots__ = ("sequence",)

    def __init__(self, items: Iterable[TranscriptItem] = (), *, sequence: int = 0) -> None:
        super().__init__(items)
        self.sequence = sequence


class Journal(Protocol):
    """One thread's journal as a turn and a compaction use it."""

    thread_id: str
    store_name: str

    async def append(
        self, events: Sequence[Event], *, expected_last_sequence: int | None = None
    ) -> list[JournalEvent]:
        """Append ``events`` as one durable batch; return them as journaled.

        With ``expected_last_sequence`` the batch lands only if the thread's last event is
        still that sequence (``SequenceConflictError`` otherwise, nothing written).
        """
        ...

    async def read_events(self, *, after: int = 0) -> list[JournalEvent]:
        """Return the thread's events with sequence above ``after``."""
        ...

    async def replay_history(self) -> ReplayHistory:
        """Return the transcript items from the last compaction boundary on (and the
        sequence they were read at)."""
        ...

    async def last_sequence(self) -> int:
        """Return the sequence of the thread's last event (0 when it has none): a mark."""
        ...


FirstAppend = Callable[[Sequence[Event]], Awaitable["list[JournalEvent] | None"]]
"""Makes a thread being created with the events of its first append (None: it would not)."""


class _Creating:
    """A thread being created: set ``done`` once it is (``error``: what stopped it)."""

    __slots__ = ("done", "error", "first")

    def __init__(self, first: FirstAppend | None) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None
        self.first = first


class ThreadJournal:
    """A :class:`Journal` straight on the store, every call bounded by ``timeout_s``.

    ``store_name`` (for example ``thread store 'jsonl'``) is what errors call the store.
    A call that does not return in time raises ``StoreError`` saying so; the store call is
    cancelled (a blocking driver call in a worker thread ends when it returns).
    """

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        *,
        store_name: str,
        timeout_s: float | None = None,
        observe: Callable[[str, Sequence[JournalEvent]], None] | None = None,
    ) -> None:
        self.store = store
        self.observe = observe
        """Called with each batch right after the store persisted it (the observer seam)."""
        self.thread_id = thread_id
        self.store_name = store_name
        self.timeout_s = timeout_s if timeout_s is not None else DEFAULT_STORE_TIMEOUT_S
        self._replayed: tuple[list[TranscriptItem], JournalEvent] | None = None
        # The journal's end as a read found it moments ago (when, read after, the events),
        # for the next replay; appends through this journal (counted, and those in flight)
        # make it stale.
        self._tail: tuple[float, int, list[JournalEvent]] | None = None
        self._appends = 0
        self._appending = 0
        self._creating: _Creating | None = None
        self.made_through = 0
        """The last sequence of the events the thread was made with (0: made without)."""

    def creating(self, first: FirstAppend | None = None) -> Callable[[BaseException | None], None]:
        """Mark the thread as being created (and its lease taken) for this journal's
        session, and return the function to call once it is, with the error that
        stopped it or None (``Runtime.start_session(create=True)``).

        Until then every store call of this journal waits (then raises that error), and
        the replay of the new thread is empty without a read; but an append (unconditional,
        or on an empty journal) is first handed to ``first``, which may make the thread
        with its events, in one store call (``ThreadStore.create_thread_with_events``).
        """
        gate = self._creating = _Creating(first)
        self._tail = (anyio.current_time(), 0, [])  # a new thread: nothing to read back

        def created(error: BaseException | None) -> None:
            gate.error = error
            gate.done.set()

        return created

    @property
    def being_created(self) -> bool:
        """Return True while the thread is being created (:meth:`creating`)."""
        gate = self._creating
        return gate is not None and not gate.done.is_set()

    async def created(self) -> None:
        """Return once a thread being created (:meth:`creating`) is; raise what stopped it."""
        gate = self._creating
        if gate is not None:
            await gate.done.wait()
            if gate.error is not None:
                raise gate.error
            self._creating = None

    async def bounded(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Return ``await call()``; raise ``StoreError`` naming the store when it is late."""
        if self._creating is not None:
            await self.created()
        return await bounded_call(
            f"{what} of thread {self.thread_id!r}",
            call,
            store_name=self.store_name,
            timeout_s=self.timeout_s,
        )

    async def append(
        self, events: Sequence[Event], *, expected_last_sequence: int | None = None
    ) -> list[JournalEvent]:
        """Append ``events`` (conditionally with ``expected_last_sequence``).

        :meth:`bounded`'s deadline written out: the append is the runtime's most frequent
        store call, and this spares it a closure and two coroutines.
        """
        store, thread_id = self.store, self.thread_id
        gate = self._creating
        if gate is not None:
            if gate.first is not None and not expected_last_sequence and events:
                made = await gate.first(events)  # the thread, made with these events
                if made is not None:
                    self._tail = None
                    self._appends += 1
                    self.made_through = made[-1].sequence
                    if self.observe is not None:
                        self.observe(thread_id, made)
                    return made
            await self.created()
        self._tail = None
        self._appending += 1
        try:
            with anyio.move_on_after(self.timeout_s) as scope:
                if expected_last_sequence is None:
                    entries = await store.append_events(thread_id, events)
                else:
                    entries = await store.append_events(
                        thread_id, events, expected_last_sequence=expected_last_sequence
                    )
        finally:
            self._appending -= 1
            self._appends += 1
        if scope.cancelled_caught:
            what = "append" if expected_last_sequence is None else "conditional append"
            raise late_error(self.store_name, self.timeout_s, f"{what} of thread {thread_id!r}")
        if self.observe is not None:
            self.observe(thread_id, entries)
        return entries

    def _new_metadata(self) -> ThreadMetadata:
        """The metadata of this thread as it is created now (as ``create_thread``)."""
        now = int(time.time() * 1000)
        return ThreadMetadata(self.thread_id, now, now)

    @asynccontextmanager
    async def lease_new(
        self, events: Sequence[Event], *, owner: str, follow_on: FollowOn | None = None
    ) -> AsyncIterator[LeasedThread]:
        """Take the lease of this new thread and create it with ``events`` as its first
        (``ThreadStore.lease_new_thread``: one store call where the store can); the lease
        is held while this is entered. ``follow_on``: what is offered to it while the store
        call runs is journaled in it, after ``events``, where the store can (the kit's,
        ``BlockingThreadStore.lease_new_thread``); it is closed when the call returns."""
        metadata, store = self._new_metadata(), self.store
        kits = getattr(store.lease_new_thread, "__func__", None) is _KIT_LEASE_NEW
        if follow_on is not None and kits:  # the kit's own method (not a wrapper of it)
            assert isinstance(store, BlockingThreadStore)
            held = store.lease_new_thread(metadata, events, owner=owner, follow_on=follow_on)
        else:
            if follow_on is not None:
                follow_on.close()
            held = store.lease_new_thread(metadata, events, owner=owner)
        leased = await bounded_call(
            f"lease and create of thread {self.thread_id!r}",
            held.__aenter__,
            store_name=self.store_name,
            timeout_s=self.timeout_s,
        )
        try:
            yield leased
        finally:
            await held.__aexit__(None, None, None)

    async def create_with_events(self, events: Sequence[Event]) -> list[JournalEvent]:
        """Create the thread (as ``Runtime.create_thread(thread_id)``) with ``events`` as
        its first, in one store call; return them as journaled."""
        metadata = self._new_metadata()
        return await bounded_call(
            f"create of thread {self.thread_id!r}",
            lambda: self.store.create_thread_with_events(metadata, events),
            store_name=self.store_name,
            timeout_s=self.timeout_s,
        )

    async def read_events(self, *, after: int = 0) -> list[JournalEvent]:
        """Return the thread's events with sequence above ``after``.

        The read also serves the next :meth:`replay_history` within :data:`TAIL_FRESH_S`
        when nothing is appended through this journal meanwhile (a session reads what
        others journaled just before its turn starts and replays: one read, not two). It
        starts at the last event the replay saw when that is earlier than ``after``.
        """
        seen = self._replayed
        start = after if seen is None else min(after, seen[1].sequence - 1)
        appends = self._appends
        entries = await self.bounded(
            "read", lambda: self.store.read_events(self.thread_id, after=start)
        )
        if self._appends == appends and not self._appending:
            self._tail = (anyio.current_time(), start, entries)
        return entries if start == after else [e for e in entries if e.sequence > after]

    async def replay_history(self) -> ReplayHistory:
        """Return the transcript items from the last compaction boundary on, with the
        sequence of the last event read (the replay runs to the journal's end).

        After the first, a replay reads only the events from the last one it saw on (the
        journal is append-only and numbered without gaps): whatever anyone appended since
        is added, a boundary among it starts the history anew, and a journal whose event
        at that sequence is another (the thread was deleted and made again) is replayed
        whole. A session replays before every turn: O(new events), not O(history).
        """
        # Decoding many events: the cyclic collector would only slow it down.
        with gc_paused():
            seen = self._replayed
            read, self._tail = self._tail, None
            if read is not None and anyio.current_time() - read[0] <= TAIL_FRESH_S:
                _, start, tail = read  # read just now, nothing appended here since
                if seen is None and start == 0:
                    return self._replay_of([], tail, tail[-1] if tail else None)
                if seen is not None and start == seen[1].sequence - 1 and tail[:1] == [seen[1]]:
                    return self._replay_of(seen[0], tail[1:], tail[-1])
            if seen is not None:
                items, last = seen
                after = last.sequence - 1
                tail = await self.bounded(
                    "replay", lambda: self.store.read_events(self.thread_id, after=after)
                )
                if tail and tail[0] == last:
                    return self._replay_of(items, tail[1:], tail[-1])
            entries = await self.bounded("replay", lambda: self.store.replay_events(self.thread_id))
            return self._replay_of([], entries, entries[-1] if entries else None)

    def _replay_of(
        self,
        items: list[TranscriptItem],
        entries: Sequence[JournalEvent],
        last: JournalEvent | None,
    ) -> ReplayHistory:
        added = [e.event.item for e in entries if isinstance(e.event, ItemCompleted)]
        history = trim_to_last_compaction_boundary([*items, *added]) if added else items
        self._replayed = (history, last) if last is not None else None
        return ReplayHistory(history, sequence=last.sequence if last is not None else 0)

    async def snapshot(self) -> ThreadSnapshot:
        """Return the thread's metadata and whole history by turn (``read_snapshot``)."""
        # Decoding many events: the cyclic collector would only slow it down.
        with gc_paused():
            return await self.bounded("load", lambda: self.store.read_snapshot(self.thread_id))

    async def metadata(self) -> ThreadMetadata:
        """Return the thread's metadata (``get_thread``)."""
        return await self.bounded("metadata read", lambda: self.store.get_thread(self.thread_id))

    async def last_sequence(self) -> int:
        """Return the sequence of the thread's last event (0 when it has none)."""
        return (await self.metadata()).last_sequence

    async def event_page(self, *, before: int | None = None, limit: int = 256) -> EventPage:
        """Return up to ``limit`` events below ``before`` (the newest when None), ascending."""
        return await self.bounded(
            "page read",
            lambda: self.store.event_page(self.thread_id, before=before, limit=limit),
        )
