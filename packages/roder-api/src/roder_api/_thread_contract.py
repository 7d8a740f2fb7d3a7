"""The thread-store contract: the records, the ``ThreadStore`` / ``ThreadStoreFactory`` bases.

This is where the contract is defined; import it from :mod:`roder_api.threads` (its public
home, which also re-exports the store kit's helpers). It lives apart so that
:mod:`roder_api.storekit` and :mod:`roder_api.codec` can import it without importing
``roder_api.threads``, which imports the kit: no import cycle. Every public name here says
``roder_api.threads`` in its ``__module__``, so pickles, reprs and docs name the public
home (one cost: ``inspect.getsource`` of those classes fails; their source is here).

Besides the records and the bases: thread-id validation, ``UNSET``, the lease types, the
in-process leases behind the default :meth:`ThreadStore.lease`, and :func:`replay_start`,
the one rule for where replay starts (the kit re-exports it).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from roder_api._leases import (
    LeasedThread,
    LeaseHolder,
    ThreadLease,
    lease_then_create,
    process_lease,
)
from roder_api._record import Record, from_dict, register
from roder_api._store_waits import AppendWakeups, find_pending_input, poll_for_events
from roder_api.errors import InvalidThreadIdError, ThreadNotFoundError
from roder_api.events import (
    Event,
    ItemCompleted,
    JournalEvent,
    is_boundary_event,
)
from roder_api.inference import TokenUsage
from roder_api.transcript import TranscriptItem

THREAD_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
"""What a thread id must match, whole."""


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` when it is valid; raise :class:`InvalidThreadIdError` otherwise."""
    if not isinstance(thread_id, str) or THREAD_ID_PATTERN.fullmatch(thread_id) is None:
        raise InvalidThreadIdError(thread_id)
    return thread_id


def replay_start(entries: Sequence[JournalEvent]) -> int:
    """Return the index in ``entries`` of the last boundary event (0 when there is none)."""
    for index in range(len(entries) - 1, -1, -1):
        if is_boundary_event(entries[index].event):
            return index
    return 0


def _usage(value: Any) -> TokenUsage:
    return value if isinstance(value, TokenUsage) else from_dict(value)


def _turn_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"open_turns must be a list of turn ids, not {value!r:.200}")
    return tuple(value)


@register("thread_metadata", usage=_usage, open_turns=_turn_ids)
@dataclass(frozen=True, slots=True)
class ThreadMetadata(Record):
    """What a listing shows of a thread, kept without reading its journal.

    ``usage`` is the sum of every ``UsageUpdated`` in the journal, ``item_count`` the number
    of ``ItemCompleted`` events, ``last_sequence`` the newest event's sequence (0: none).
    ``extra`` is free-form JSON (for example ``forked_from``). ``open_turns`` holds the ids
    of the turns accepted (``InputAccepted`` that is not a steer) or started and not yet
    ended (``TurnComplete`` / ``TurnAborted``), in the order they opened: what
    :meth:`ThreadStore.threads_with_pending_input` asks about. Like the counts, it is folded
    by the store at append time (a value passed to ``create_thread`` is ignored).
    """

    thread_id: str
    created_at_ms: int
    updated_at_ms: int
    title: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    item_count: int = 0
    last_sequence: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    open_turns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Turn:
    """The transcript items of one turn, in order."""

    turn_id: str
    items: tuple[TranscriptItem, ...]


class TurnFold:
    """Groups transcript items into turns, in journal order, across any number of reads.

    Consecutive items of one turn id make one :class:`Turn` (a turn id that comes back
    later starts a new turn), also when a read ends in the middle of a turn. What
    :meth:`ThreadStore.read_snapshot` and ``turns_from_events`` are built from.
    """

    __slots__ = ("_items", "_turn_id", "_turns")

    def __init__(self) -> None:
        self._turns: list[Turn] = []
        self._turn_id: str | None = None
        self._items: list[TranscriptItem] = []

    def add(self, turn_id: str, item: TranscriptItem) -> None:
        """Add one item of turn ``turn_id``."""
        if turn_id != self._turn_id:
            self._close()
            self._turn_id = turn_id
        self._items.append(item)

    def add_events(self, entries: Iterable[JournalEvent]) -> None:
        """Add the items of the ``ItemCompleted`` events among ``entries``."""
        add = self.add
        for entry in entries:
            event = entry.event
            if isinstance(event, ItemCompleted):
                add(event.turn_id, event.item)

    def turns(self) -> tuple[Turn, ...]:
        """Return the turns folded so far (the last one included)."""
        self._close()
        return tuple(self._turns)

    def _close(self) -> None:
        if self._turn_id is not None and self._items:
            self._turns.append(Turn(self._turn_id, tuple(self._items)))
            self._items = []


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """A thread's metadata and its whole history grouped by turn."""

    metadata: ThreadMetadata
    turns: tuple[Turn, ...]

    @property
    def items(self) -> list[TranscriptItem]:
        """Return every transcript item of every turn, in order."""
        return [item for turn in self.turns for item in turn.items]


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """A page of threads, newest update first; pass ``next_cursor`` for the next page."""

    threads: tuple[ThreadMetadata, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class EventPage:
    """Journal events in ascending sequence order; ``next_before`` pages further back."""

    events: tuple[JournalEvent, ...]
    next_before: int | None


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""Marks an argument that was not given (as opposed to None)."""


# --- the store contract ---------------------------------------------------------------------


class ThreadStore(ABC):
    """A thread store: per-thread append-only journals of events plus listable metadata.

    Implementations must append a batch atomically and durably before returning, assign
    consecutive sequence numbers from 1, validate thread ids with :func:`validate_thread_id`,
    and be safe for many tasks (and, where stated, many processes) at once. Blocking work runs
    off the event loop. ``roder_api.testing`` holds the conformance suite.
    """

    snapshot_chunk: ClassVar[int] = 8192
    """How many events the default :meth:`read_snapshot` reads from the journal at a time."""

    @abstractmethod
    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread with ``metadata`` (title, times, extra); return what is stored.

        Raise ``ThreadExistsError`` when the id is taken. Usage, counts and
        ``last_sequence`` of ``metadata`` are ignored: they are folded from the journal.
        """

    async def create_thread_with_events(
        self, metadata: ThreadMetadata, events: Sequence[Event]
    ) -> list[JournalEvent]:
        """Create a thread and journal its first ``events``; return them as journaled.

        What :meth:`create_thread`, then :meth:`append_events`, do (which this default
        calls); a store may do both in one durable write, never leaving the thread without
        them (the JSONL store: two syncs instead of three). ``ThreadExistsError`` when the
        id is taken, and nothing is written. ``Runtime.start_session(create=True)`` makes a
        new thread with the first turn's start this way.
        """
        await self.create_thread(metadata)
        return await self.append_events(metadata.thread_id, events) if events else []

    @abstractmethod
    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata; raise ``ThreadNotFoundError`` when it does not exist."""

    async def thread_exists(self, thread_id: str) -> bool:
        """Return True when the thread exists."""
        try:
            await self.get_thread(thread_id)
        except ThreadNotFoundError:
            return False
        return True

    @abstractmethod
    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata; return the new metadata."""

    @abstractmethod
    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append ``events`` as one atomic, durable batch; return them as journaled.

        With ``expected_last_sequence=N`` the batch is appended only if the thread's newest
        event is still sequence N (0: the thread has no events), checked and written as one
        step no other task, process or machine can get between; otherwise raise
        ``SequenceConflictError`` (``.expected`` N, ``.actual`` the real last sequence,
        see :func:`check_expected`) and write nothing. Raise ``UnserializableEventError``
        (storing nothing) when an event cannot be serialised.
        """

    @abstractmethod
    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim (same sequence numbers and times), atomically.

        Raise ``SequenceConflictError`` unless they continue the journal consecutively.
        """

    @abstractmethod
    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the journal events with sequence above ``after``, in order."""

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return up to ``limit`` events below ``before`` (newest when None), ascending."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if before is None:
            meta = await self.get_thread(thread_id)
            before = meta.last_sequence + 1
        after = max(0, before - 1 - limit)
        events = [e for e in await self.read_events(thread_id, after=after) if e.sequence < before]
        first = events[0].sequence if events else before
        return EventPage(tuple(events), first if first > 1 else None)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last compaction boundary on (all when there is none)."""
        entries = await self.read_events(thread_id)
        return entries[replay_start(entries) :]

    async def read_snapshot(self, thread_id: str) -> ThreadSnapshot:
        """Return the thread's metadata and its transcript items grouped by turn.

        What ``Runtime.load_thread`` returns; raise ``ThreadNotFoundError`` when the thread
        does not exist. The default reads the journal :attr:`snapshot_chunk` events at a
        time (a long thread never holds its items twice) and folds them with
        :class:`TurnFold`; a store may answer in one step, with the same result.
        """
        fold = TurnFold()
        after = 0
        while True:
            events = await self.read_events(thread_id, after=after, limit=self.snapshot_chunk)
            fold.add_events(events)
            if len(events) < self.snapshot_chunk:
                break
            after = events[-1].sequence
        return ThreadSnapshot(await self.get_thread(thread_id), fold.turns())

    @abstractmethod
    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first, with a stable cursor."""

    @abstractmethod
    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread and its journal; raise ``ThreadNotFoundError`` if it is absent."""

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return a context manager that holds the thread's lease while it is entered.

        One holder at a time: entering raises ``ThreadBusyError`` at once (naming the
        holder) when another holds it. A holder that dies releases it without cleanup.
        Appends never need the lease; sessions always take it.

        The default holds the lease among the users of this store object only; stores
        shared by processes (or machines) override it with an OS or database lock.
        """
        validate_thread_id(thread_id)
        return process_lease(id(self), thread_id, owner)

    def lease_new_thread(
        self, metadata: ThreadMetadata, events: Sequence[Event], *, owner: str
    ) -> AbstractAsyncContextManager[LeasedThread]:
        """Return a context manager that takes a new thread's lease and creates the thread
        with its first ``events`` (:meth:`create_thread_with_events`), holding the lease
        while it is entered (it yields the :class:`LeasedThread`).

        The default takes the lease, then creates; a store may do both in one call (the
        kit's stores with file leases: one worker call). Entering raises what the lease or
        the create raises (``ThreadBusyError``, ``ThreadExistsError``), holding nothing.
        ``Runtime.start_session(create=True)`` makes its thread this way.
        """
        validate_thread_id(metadata.thread_id)
        return lease_then_create(self, metadata, events, owner)

    wait_poll_s: ClassVar[tuple[float, float]] = (0.02, 0.25)
    """The first and the longest pause of the default :meth:`wait_for_events` poll."""

    _append_wakeups: AppendWakeups | None = None

    @property
    def append_wakeups(self) -> AppendWakeups:
        """Return the in-process waiters of :meth:`wait_for_events` (created on first use)."""
        if self._append_wakeups is None:
            self._append_wakeups = AppendWakeups()
        return self._append_wakeups

    def notify_appended(
        self, thread_id: str, last_sequence: int, entries: Sequence[JournalEvent] = ()
    ) -> None:
        """Wake this process's :meth:`wait_for_events` waiters of ``thread_id`` at once.

        Call it on the event loop once an append is durable (``entries``: the batch, for
        ``AppendWakeups.listen``). The kit's stores call it; a store of its own calls it
        after its append (or its waiters find the append by the poll, ``wait_poll_s[1]``)."""
        if self._append_wakeups is not None:
            self._append_wakeups.wake(thread_id, last_sequence, entries)

    async def wait_for_events(self, thread_id: str, after_sequence: int, timeout_s: float) -> int:
        """Return the thread's last sequence once it is above ``after_sequence``, or after
        ``timeout_s`` seconds (then it may be ``after_sequence`` or less).

        What a server's streams and a lease holder's session wait on. Raise
        ``ThreadNotFoundError`` when the thread does not exist (or is deleted meanwhile).
        The default is woken at once by an append through this store object in this event
        loop (:meth:`notify_appended`), and polls the metadata's ``last_sequence`` for
        appends by other processes, with a pause that grows from :attr:`wait_poll_s`
        ``[0]`` to ``[1]`` (cheap when idle); a store that can be woken from other
        processes (PostgreSQL ``LISTEN/NOTIFY``) overrides it.
        """
        return await poll_for_events(self, thread_id, after_sequence, timeout_s)

    pending_tail: ClassVar[int] = 256
    """How many events a page of the default :meth:`threads_with_pending_input` reads while
    it pages back through a thread (until it knows whether a turn is open)."""

    async def threads_with_pending_input(
        self, *, updated_after_ms: int = 0, limit: int = 100
    ) -> list[str]:
        """Return the ids of threads (updated at or after ``updated_after_ms``, newest first,
        at most ``limit``) whose journal may hold input accepted and not yet answered, or a
        turn left open: what a server opens a session on after a restart, so that the
        session answers the input (or closes the turn by the crash rules).

        The default walks the listing (metadata only) down to ``updated_after_ms`` and
        pages back through each thread's journal (:attr:`pending_tail` events a page) until
        it meets a turn opened and not ended, or the start: correct, but it reads every
        journal. A store that keeps :attr:`ThreadMetadata.open_turns` in a column answers
        it with one indexed query instead (the relational and JSONL stores do). False
        positives are harmless (the session finds nothing to do).
        """
        return await find_pending_input(self, updated_after_ms, limit)

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the bytes a thread occupies in the store, or None when the store cannot tell.

        Used by ``roder threads prune`` to say how much space deleting frees. The default
        returns None (the command then estimates from the serialised journal); raise
        ``ThreadNotFoundError`` when the thread does not exist.
        """
        await self.get_thread(thread_id)
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release the store's resources; the default does nothing."""

    async def __aenter__(self) -> ThreadStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class ThreadStoreFactory(ABC):
    """Opens thread stores of one backend; registered under ``id``."""

    id: str = ""

    @abstractmethod
    async def open(self) -> ThreadStore:
        """Return an open store; raise a ``StoreError`` with advice when it cannot be opened."""

    def describe(self) -> str:
        """Return a one-line description of where this factory stores threads."""
        return self.id


# The public home of each name (see the module doc); the codec's type tags do not depend on
# it (``register`` keys on the tag), pickles and reprs do.
for _public in (
    EventPage,
    LeasedThread,
    LeaseHolder,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    ThreadStore,
    ThreadStoreFactory,
    Turn,
    validate_thread_id,
):
    _public.__module__ = "roder_api.threads"
replay_start.__module__ = "roder_api.storekit._fold"
TurnFold.__module__ = "roder_api.storekit"
del _public

__all__ = [
    "EventPage",
    "LeaseHolder",
    "LeasedThread",
    "THREAD_ID_PATTERN",
    "ThreadLease",
    "ThreadMetadata",
    "ThreadPage",
    "ThreadSnapshot",
    "ThreadStore",
    "ThreadStoreFactory",
    "Turn",
    "TurnFold",
    "UNSET",
    "replay_start",
    "validate_thread_id",
]
