"""``MemoryThreadStore``: a complete thread store in memory, for tests and examples.

It keeps the whole contract — atomic batches, conditional appends, imports, pages, listing
cursors, leases — and stores every event as its JSON bytes, so what it refuses and what it
gives back are what a real store refuses and gives back. Tests subclass it to inject
faults: :meth:`MemoryThreadStore.fault_point` runs before every operation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from roder_api.codec import dumps, dumps_each, from_dict, journal_events, loads_json
from roder_api.errors import (
    SequenceConflictError,
    StoppedError,
    ThreadBusyError,
    ThreadExistsError,
    ThreadNotFoundError,
)
from roder_api.events import Event, JournalEvent
from roder_api.inference import TokenUsage
from roder_api.storekit import (
    check_consecutive,
    check_expected,
    decode_cursor,
    encode_cursor,
    fold_metadata,
    last_boundary_sequence,
    listing_key,
    metadata_changes,
    payloads_of,
    validate_expected,
)
from roder_api.threads import (
    UNSET,
    EventPage,
    LeaseHolder,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadStore,
    ThreadStoreFactory,
    validate_thread_id,
)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Thread:
    metadata: bytes
    events: list[tuple[int, int, bytes]] = field(default_factory=list)
    boundary: int = 0

    @property
    def last_sequence(self) -> int:
        return self.events[-1][0] if self.events else 0


class MemoryData:
    """The threads of one in-memory store; store objects opened on it share them.

    A lock guards every change, so store objects on one ``MemoryData`` may be used from
    several tasks, event loops and threads at once.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: dict[str, _Thread] = {}
        self.leases: dict[str, LeaseHolder] = {}


def _decode_metadata(raw: bytes) -> ThreadMetadata:
    metadata: ThreadMetadata = from_dict(loads_json(raw))
    return metadata


def _decode(rows: Sequence[tuple[int, int, bytes]]) -> list[JournalEvent]:
    return journal_events(rows)


class MemoryThreadStore(ThreadStore):
    """A thread store in memory: complete, and what tests subclass to inject faults.

    ``data`` is shared by the store objects opened on it (a :class:`MemoryData`; a fresh
    one when omitted), so two stores on one ``data`` behave like two opens of one
    database. Leases are held among the users of ``data`` (this process only). Everything
    is checked and written under one lock, with no ``await`` in between, so a conditional
    append is one step.
    """

    def __init__(self, data: MemoryData | None = None) -> None:
        self.data = MemoryData() if data is None else data
        self.closed = False

    # --- hooks for tests ------------------------------------------------------------------

    async def fault_point(self, operation: str, thread_id: str | None) -> None:
        """Run before every operation (``operation`` is the method's name); does nothing.

        Override it to inject a fault (raise ``StoreError``, ``OSError``...) or to widen a
        race (``await anyio.sleep(...)``) before the operation touches the data.
        """

    # --- helpers --------------------------------------------------------------------------

    async def _enter(self, operation: str, thread_id: str | None) -> None:
        if thread_id is not None:
            validate_thread_id(thread_id)
        self._check_open()
        await self.fault_point(operation, thread_id)
        self._check_open()

    def _check_open(self) -> None:
        if self.closed:
            raise StoppedError("the memory thread store is closed; open a new one")

    def _thread(self, thread_id: str) -> _Thread:
        thread = self.data.threads.get(thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        return thread

    def _commit(
        self, thread: _Thread, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Add journaled events to ``thread`` and fold its metadata (call under the lock)."""
        folded = fold_metadata(_decode_metadata(thread.metadata), entries)
        metadata = dumps(folded)
        thread.events.extend(
            (entry.sequence, entry.recorded_at_ms, payload)
            for entry, payload in zip(entries, payloads, strict=True)
        )
        thread.boundary = last_boundary_sequence(entries, thread.boundary)
        thread.metadata = metadata

    # --- the contract ---------------------------------------------------------------------

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread; raise ``ThreadExistsError`` when the id is taken."""
        await self._enter("create_thread", metadata.thread_id)
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0, open_turns=())
        raw = dumps(stored)
        with self.data.lock:
            if stored.thread_id in self.data.threads:
                raise ThreadExistsError(stored.thread_id)
            self.data.threads[stored.thread_id] = _Thread(raw)
        return _decode_metadata(raw)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata."""
        await self._enter("get_thread", thread_id)
        with self.data.lock:
            return _decode_metadata(self._thread(thread_id).metadata)

    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata."""
        await self._enter("update_thread", thread_id)
        changes = metadata_changes(title, extra)
        with self.data.lock:
            thread = self._thread(thread_id)
            metadata = _decode_metadata(thread.metadata)
            if not changes:
                return metadata
            updated = replace(
                metadata, updated_at_ms=max(metadata.updated_at_ms, _now_ms()), **changes
            )
            thread.metadata = dumps(updated)
            return _decode_metadata(thread.metadata)

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append ``events`` as one atomic batch (conditionally, when expected)."""
        await self._enter("append_events", thread_id)
        expected = validate_expected(expected_last_sequence)
        payloads = payloads_of(events)
        with self.data.lock:
            thread = self._thread(thread_id)
            last = thread.last_sequence
            check_expected(thread_id, expected, last)
            if not events:
                return []
            now = _now_ms()
            entries = [JournalEvent(last + 1 + i, now, e) for i, e in enumerate(events)]
            self._commit(thread, entries, payloads)
        self.notify_appended(thread_id, entries[-1].sequence, entries)
        return entries

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim; ``SequenceConflictError`` unless they continue."""
        await self._enter("import_events", thread_id)
        with self.data.lock:
            self._thread(thread_id)
        if not entries:
            return
        check_consecutive(thread_id, entries)
        payloads = dumps_each([entry.event for entry in entries])
        with self.data.lock:
            thread = self._thread(thread_id)
            if entries[0].sequence != thread.last_sequence + 1:
                raise SequenceConflictError(
                    thread_id, thread.last_sequence + 1, entries[0].sequence
                )
            self._commit(thread, entries, payloads)
        self.notify_appended(thread_id, entries[-1].sequence, entries)

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the events with sequence above ``after``, in order."""
        await self._enter("read_events", thread_id)
        with self.data.lock:
            rows = [row for row in self._thread(thread_id).events if row[0] > after]
        return _decode(rows if limit is None else rows[:limit])

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return up to ``limit`` events below ``before`` (newest when None), ascending."""
        await self._enter("event_page", thread_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        with self.data.lock:
            thread = self._thread(thread_id)
            if before is None:
                before = thread.last_sequence + 1
            rows = [row for row in thread.events if row[0] < before][-limit:]
        events = tuple(_decode(rows))
        first = events[0].sequence if events else before
        return EventPage(events, first if first > 1 else None)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last compaction boundary on."""
        await self._enter("replay_events", thread_id)
        with self.data.lock:
            thread = self._thread(thread_id)
            rows = [row for row in thread.events if row[0] >= thread.boundary]
        return _decode(rows)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first."""
        await self._enter("list_threads", None)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        position = decode_cursor(cursor) if cursor else None
        with self.data.lock:
            everything = [_decode_metadata(t.metadata) for t in self.data.threads.values()]
        everything.sort(key=listing_key, reverse=True)
        if position is not None:
            everything = [m for m in everything if listing_key(m) < position]
        page = everything[:limit]
        more = len(everything) > limit
        return ThreadPage(tuple(page), encode_cursor(*listing_key(page[-1])) if more else None)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread and its journal."""
        await self._enter("delete_thread", thread_id)
        with self.data.lock:
            self._thread(thread_id)
            del self.data.threads[thread_id]

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the bytes of the thread's metadata and events as stored."""
        await self._enter("thread_size_bytes", thread_id)
        with self.data.lock:
            thread = self._thread(thread_id)
            return len(thread.metadata) + sum(len(row[2]) for row in thread.events)

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return the thread's lease, held among the store objects sharing :attr:`data`."""
        validate_thread_id(thread_id)
        return self._lease(thread_id, owner)

    @asynccontextmanager
    async def _lease(self, thread_id: str, owner: str) -> AsyncIterator[ThreadLease]:
        await self._enter("lease", thread_id)
        holder = LeaseHolder.current(owner)
        with self.data.lock:
            current = self.data.leases.get(thread_id)
            if current is not None:
                raise ThreadBusyError(thread_id, current)
            self.data.leases[thread_id] = holder
        try:
            yield ThreadLease(thread_id, holder)
        finally:
            with self.data.lock:
                if self.data.leases.get(thread_id) is holder:
                    del self.data.leases[thread_id]

    async def aclose(self) -> None:
        """Close this store object (the data stays for other store objects)."""
        self.closed = True


class MemoryThreadStoreFactory(ThreadStoreFactory):
    """Opens :class:`MemoryThreadStore` objects that share one :class:`MemoryData`.

    ``store_class`` picks the class opened (a subclass that injects faults, say).
    """

    id = "memory"

    def __init__(self, *, store_class: type[MemoryThreadStore] = MemoryThreadStore) -> None:
        self.data = MemoryData()
        self.store_class = store_class

    async def open(self) -> MemoryThreadStore:
        """Return a store on this factory's data."""
        return self.store_class(self.data)

    def describe(self) -> str:
        """Return that the threads live in memory."""
        return "memory (threads are lost when the process ends)"


__all__ = ["MemoryData", "MemoryThreadStore", "MemoryThreadStoreFactory"]
