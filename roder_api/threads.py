"""Threads: metadata, snapshots, pages, and the ``ThreadStore`` / ``ThreadStoreFactory`` bases.

A thread is an append-only, per-thread, sequenced journal of events. A snapshot is a fold
over it: :func:`fold_metadata` and :func:`turns_from_events` are that fold, shared by every
store so that they all agree.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson

from roder_api._record import Record, from_dict, register
from roder_api.errors import (
    InvalidThreadIdError,
    SequenceConflictError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from roder_api.events import (
    Event,
    ItemCompleted,
    JournalEvent,
    UsageUpdated,
    is_boundary_event,
)
from roder_api.inference import TokenUsage
from roder_api.transcript import TranscriptItem

T = TypeVar("T")

THREAD_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
"""What a thread id must match, whole."""


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` when it is valid; raise :class:`InvalidThreadIdError` otherwise."""
    if not isinstance(thread_id, str) or THREAD_ID_PATTERN.fullmatch(thread_id) is None:
        raise InvalidThreadIdError(thread_id)
    return thread_id


def _usage(value: Any) -> TokenUsage:
    return value if isinstance(value, TokenUsage) else from_dict(value)


@register("thread_metadata", usage=_usage)
@dataclass(frozen=True, slots=True)
class ThreadMetadata(Record):
    """What a listing shows of a thread, kept without reading its journal.

    ``usage`` is the sum of every ``UsageUpdated`` in the journal, ``item_count`` the number
    of ``ItemCompleted`` events, ``last_sequence`` the newest event's sequence (0: none).
    ``extra`` is free-form JSON (for example ``forked_from``).
    """

    thread_id: str
    created_at_ms: int
    updated_at_ms: int
    title: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    item_count: int = 0
    last_sequence: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Turn:
    """The transcript items of one turn, in order."""

    turn_id: str
    items: tuple[TranscriptItem, ...]


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


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a thread's lease: the owner's name, its process id and host, and since when."""

    owner: str
    pid: int
    host: str
    since_ms: int

    @classmethod
    def current(cls, owner: str) -> LeaseHolder:
        """Return a holder for ``owner`` in this process, on this host, from now."""
        return cls(owner, os.getpid(), socket.gethostname(), int(time.time() * 1000))

    def describe(self) -> str:
        """Return the holder in words: owner, pid, host and since when (UTC)."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))
        return f"{self.owner} (pid {self.pid} on {self.host}, since {since})"


@dataclass(frozen=True, slots=True)
class ThreadLease:
    """The right, held by one session at a time, to run turns on a thread."""

    thread_id: str
    holder: LeaseHolder


class _ProcessLeases:
    """The leases held in this process by stores that have no cross-process lease."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], LeaseHolder] = {}

    def acquire(self, scope: int, thread_id: str, holder: LeaseHolder) -> None:
        with self._lock:
            current = self._held.get((scope, thread_id))
            if current is not None:
                raise ThreadBusyError(thread_id, current)
            self._held[(scope, thread_id)] = holder

    def release(self, scope: int, thread_id: str) -> None:
        with self._lock:
            self._held.pop((scope, thread_id), None)


_PROCESS_LEASES = _ProcessLeases()


# --- the fold -------------------------------------------------------------------------------


def fold_metadata(metadata: ThreadMetadata, entries: Iterable[JournalEvent]) -> ThreadMetadata:
    """Return ``metadata`` advanced over journal ``entries`` (usage, counts, times)."""
    usage = metadata.usage
    item_count = metadata.item_count
    last_sequence = metadata.last_sequence
    updated = metadata.updated_at_ms
    changed = False
    for entry in entries:
        changed = True
        event = entry.event
        if isinstance(event, UsageUpdated):
            usage = usage + event.usage
        elif isinstance(event, ItemCompleted):
            item_count += 1
        last_sequence = entry.sequence
        if entry.recorded_at_ms > updated:
            updated = entry.recorded_at_ms
    if not changed:
        return metadata
    return replace(
        metadata,
        usage=usage,
        item_count=item_count,
        last_sequence=last_sequence,
        updated_at_ms=updated,
    )


def turns_from_events(entries: Iterable[JournalEvent]) -> tuple[Turn, ...]:
    """Return the transcript items of ``entries`` grouped into turns, in journal order."""
    turns: list[Turn] = []
    current_id: str | None = None
    current: list[TranscriptItem] = []
    for entry in entries:
        event = entry.event
        if not isinstance(event, ItemCompleted):
            continue
        if event.turn_id != current_id:
            if current_id is not None:
                turns.append(Turn(current_id, tuple(current)))
            current_id, current = event.turn_id, []
        current.append(event.item)
    if current_id is not None:
        turns.append(Turn(current_id, tuple(current)))
    return tuple(turns)


def replay_start(entries: Sequence[JournalEvent]) -> int:
    """Return the index in ``entries`` of the last boundary event (0 when there is none)."""
    for index in range(len(entries) - 1, -1, -1):
        if is_boundary_event(entries[index].event):
            return index
    return 0


def last_boundary_sequence(entries: Sequence[JournalEvent], previous: int) -> int:
    """Return the sequence of the last boundary event in ``entries``, else ``previous``.

    Stores that remember where replay starts advance it with this on every append.
    """
    for entry in reversed(entries):
        if is_boundary_event(entry.event):
            return entry.sequence
    return previous


def encode_cursor(updated_at_ms: int, thread_id: str) -> str:
    """Return an opaque listing cursor for the position after ``(updated_at_ms, thread_id)``."""
    raw = orjson.dumps([updated_at_ms, thread_id])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """Return the ``(updated_at_ms, thread_id)`` of a cursor; raise ``ValueError`` if bad."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        updated, thread_id = orjson.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(updated, int) or not isinstance(thread_id, str):
            raise ValueError
    except Exception:
        raise ValueError(f"invalid thread listing cursor {cursor!r}") from None
    return updated, thread_id


def listing_key(metadata: ThreadMetadata) -> tuple[int, str]:
    """Return the sort key of listings: newest update first, then thread id descending."""
    return (metadata.updated_at_ms, metadata.thread_id)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""Marks an argument that was not given (as opposed to None)."""


def metadata_changes(title: Any = UNSET, extra: Any = UNSET) -> dict[str, Any]:
    """Return the metadata changes an ``update_thread`` call asks for (``title``, ``extra``).

    Arguments left ``UNSET`` are not included; an empty result means "change nothing".
    """
    changes: dict[str, Any] = {}
    if title is not UNSET:
        changes["title"] = title
    if extra is not UNSET:
        changes["extra"] = dict(extra)
    return changes


def validate_expected(expected_last_sequence: object) -> int | None:
    """Return ``expected_last_sequence`` when it is None or an int >= 0; else ValueError."""
    if expected_last_sequence is None:
        return None
    if (
        not isinstance(expected_last_sequence, int)
        or isinstance(expected_last_sequence, bool)
        or expected_last_sequence < 0
    ):
        raise ValueError(
            f"expected_last_sequence must be None or an integer >= 0, "
            f"not {expected_last_sequence!r}"
        )
    return expected_last_sequence


def check_expected(thread_id: str, expected_last_sequence: int | None, actual: int) -> None:
    """Raise the conditional append's ``SequenceConflictError`` when ``actual`` is not expected.

    ``actual`` is the thread's real last sequence, read inside the store's write step;
    ``expected_last_sequence`` None means "append unconditionally" (never raises).
    """
    if expected_last_sequence is not None and expected_last_sequence != actual:
        raise SequenceConflictError.conditional(thread_id, expected_last_sequence, actual)


def check_consecutive(thread_id: str, entries: Sequence[JournalEvent]) -> None:
    """Raise ``SequenceConflictError`` unless ``entries`` have consecutive sequence numbers."""
    for previous, entry in zip(entries, entries[1:], strict=False):
        if entry.sequence != previous.sequence + 1:
            raise SequenceConflictError(thread_id, previous.sequence + 1, entry.sequence)


# --- the store contract ---------------------------------------------------------------------


class ThreadStore(ABC):
    """A thread store: per-thread append-only journals of events plus listable metadata.

    Implementations must append a batch atomically and durably before returning, assign
    consecutive sequence numbers from 1, validate thread ids with :func:`validate_thread_id`,
    and be safe for many tasks (and, where stated, many processes) at once. Blocking work runs
    off the event loop. ``roder_api.testing`` holds the conformance suite.
    """

    @abstractmethod
    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread with ``metadata`` (title, times, extra); return what is stored.

        Raise ``ThreadExistsError`` when the id is taken. Usage, counts and
        ``last_sequence`` of ``metadata`` are ignored: they are folded from the journal.
        """

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
        return self._process_lease(thread_id, owner)

    @asynccontextmanager
    async def _process_lease(self, thread_id: str, owner: str) -> AsyncIterator[ThreadLease]:
        holder = LeaseHolder.current(owner)
        _PROCESS_LEASES.acquire(id(self), thread_id, holder)
        try:
            yield ThreadLease(thread_id, holder)
        finally:
            _PROCESS_LEASES.release(id(self), thread_id)

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


class BlockingThreadStore(ThreadStore):
    """A thread store whose work is blocking code (a database driver, file I/O).

    Subclasses implement ``_run`` — move a blocking call off the event loop (for example
    ``anyio.to_thread.run_sync``), raising ``StoppedError`` once closed and translating
    driver errors into ``StoreError`` — and the blocking methods below. This class
    validates ids and arguments, serialises events (``roder_api.codec.dumps_each``) before
    any blocking work starts, and maps every ``ThreadStore`` method onto them. The SQLite
    and PostgreSQL stores are built this way.
    """

    @abstractmethod
    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        """Return ``func(*args)`` run off the event loop."""

    @abstractmethod
    def _create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create the thread (``ThreadExistsError`` when taken); return what is stored."""

    @abstractmethod
    def _get_sync(self, thread_id: str) -> ThreadMetadata:
        """Return the thread's metadata (``ThreadNotFoundError`` when absent)."""

    @abstractmethod
    def _update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        """Apply :func:`metadata_changes` output; return the new metadata."""

    @abstractmethod
    def _append_sync(
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
    def _import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Append journal events verbatim; ``SequenceConflictError`` unless they continue."""

    @abstractmethod
    def _read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        """Return events above ``after`` (from the last boundary on when ``replay``)."""

    @abstractmethod
    def _page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        """Return the :meth:`ThreadStore.event_page` answer."""

    @abstractmethod
    def _list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        """Return the :meth:`ThreadStore.list_threads` answer."""

    @abstractmethod
    def _delete_sync(self, thread_id: str) -> None:
        """Delete the thread (``ThreadNotFoundError`` when absent)."""

    def _size_sync(self, thread_id: str) -> int | None:
        """Return the bytes the thread takes, or None when unknown (the default)."""
        return None

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread; raise ``ThreadExistsError`` when the id is taken."""
        validate_thread_id(metadata.thread_id)
        return await self._run(self._create_sync, metadata)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata."""
        validate_thread_id(thread_id)
        return await self._run(self._get_sync, thread_id)

    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata."""
        from roder_api.codec import check_value  # the codec imports this module

        validate_thread_id(thread_id)
        changes = metadata_changes(title, extra)
        if not changes:
            return await self.get_thread(thread_id)
        check_value(changes, what="the thread's new metadata")
        return await self._run(self._update_sync, thread_id, changes)

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append ``events`` as one atomic, durable batch (conditionally, when expected)."""
        from roder_api.codec import dumps_each  # the codec imports this module

        validate_thread_id(thread_id)
        expected = validate_expected(expected_last_sequence)
        if not events:
            if expected is not None:
                last = (await self.get_thread(thread_id)).last_sequence
                check_expected(thread_id, expected, last)
            return []
        payloads = dumps_each(events)
        return await self._run(self._append_sync, thread_id, list(events), payloads, expected)

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim, atomically."""
        from roder_api.codec import dumps_each  # the codec imports this module

        validate_thread_id(thread_id)
        if not entries:
            return
        check_consecutive(thread_id, entries)
        payloads = dumps_each([entry.event for entry in entries])
        await self._run(self._import_sync, thread_id, list(entries), payloads)

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the events with sequence above ``after``, in order."""
        validate_thread_id(thread_id)
        return await self._run(self._read_sync, thread_id, after, limit, False)

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return up to ``limit`` events below ``before`` (newest when None), ascending."""
        validate_thread_id(thread_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._run(self._page_sync, thread_id, before, limit)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last compaction boundary on."""
        validate_thread_id(thread_id)
        return await self._run(self._read_sync, thread_id, 0, None, True)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._run(self._list_sync, cursor, limit)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread and its journal."""
        validate_thread_id(thread_id)
        await self._run(self._delete_sync, thread_id)

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the bytes the thread takes in the store, or None when unknown."""
        validate_thread_id(thread_id)
        return await self._run(self._size_sync, thread_id)


class ThreadStoreFactory(ABC):
    """Opens thread stores of one backend; registered under ``id``."""

    id: str = ""

    @abstractmethod
    async def open(self) -> ThreadStore:
        """Return an open store; raise a ``StoreError`` with advice when it cannot be opened."""

    def describe(self) -> str:
        """Return a one-line description of where this factory stores threads."""
        return self.id


__all__ = [
    "BlockingThreadStore",
    "EventPage",
    "LeaseHolder",
    "THREAD_ID_PATTERN",
    "ThreadLease",
    "ThreadMetadata",
    "ThreadPage",
    "ThreadSnapshot",
    "ThreadStore",
    "ThreadStoreFactory",
    "Turn",
    "UNSET",
    "check_consecutive",
    "check_expected",
    "decode_cursor",
    "encode_cursor",
    "fold_metadata",
    "last_boundary_sequence",
    "listing_key",
    "metadata_changes",
    "replay_start",
    "turns_from_events",
    "validate_expected",
    "validate_thread_id",
]
