"""One write transaction of a relational store: the rows it touches, folded in memory.

A :class:`WriteBatch` loads each thread's row once (locked, where the dialect locks rows),
applies the operations of the transaction to it in memory — every check (thread missing,
id taken, sequence conflict, value refused) is made before any SQL of that operation runs,
so a refused operation leaves nothing behind and the others go on — and writes the events
and the folded metadata when the transaction ends (:meth:`WriteBatch.flush`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from roder_api._thread_contract import ThreadMetadata
from roder_api.codec import dumps, loads
from roder_api.errors import ThreadExistsError, ThreadNotFoundError
from roder_api.events import Event, JournalEvent
from roder_api.inference import TokenUsage
from roder_api.storekit._checks import check_continues, check_expected
from roder_api.storekit._fold import fold_metadata, last_boundary_sequence

SqlConnection = Any
"""A DB-API style connection: ``execute(sql, params)`` returns a cursor with ``fetchone``,
``fetchall`` and ``rowcount`` (``sqlite3.Connection`` and ``psycopg.Connection`` both do)."""

EventRow = tuple[int, int, Any]
"""An event as a row: its sequence, its time and its payload in the database's type."""

KnownRow = tuple[int, int, ThreadMetadata]
"""A thread's row as last committed by this store: its last sequence, its boundary
sequence and its metadata (what :meth:`WriteBatch.load` would read)."""


@dataclass(slots=True)
class ThreadRow:
    """A thread's row as the transaction sees it, with the events it has yet to insert."""

    last_sequence: int
    boundary_sequence: int
    metadata: ThreadMetadata
    pending: list[EventRow] = field(default_factory=list)
    dirty: bool = False


class WriteBatch:
    """The threads one write transaction touches; see the module docstring.

    ``sql(text)`` turns the kit's ``?`` placeholders into the dialect's; ``row_lock`` is
    appended to the row query (``" FOR UPDATE"`` or ``""``); ``insert_events`` inserts one
    thread's new event rows; ``encode_payload`` turns an event's JSON bytes into the value
    the database stores (None: the bytes as they are); ``now_ms`` stamps appended events.
    ``known``, when given, holds rows as this store last committed them, vouched for by the
    caller (no other writer has committed since): :meth:`load` takes a row from it instead
    of reading it.
    """

    def __init__(
        self,
        conn: SqlConnection,
        *,
        sql: Callable[[str], str],
        row_lock: str,
        insert_events: Callable[[SqlConnection, str, Sequence[EventRow]], None],
        encode_payload: Callable[[bytes], Any] | None,
        now_ms: Callable[[], int],
        known: dict[str, KnownRow] | None = None,
    ) -> None:
        self.conn = conn
        self._sql = sql
        self._row_query = sql(
            "SELECT last_sequence, boundary_sequence, metadata FROM roder_threads "
            "WHERE thread_id = ?" + row_lock
        )
        self._insert_events = insert_events
        self._encode = encode_payload
        self._now_ms = now_ms
        self._known = known
        self.rows: dict[str, ThreadRow | None] = {}

    def load(self, thread_id: str) -> ThreadRow | None:
        """Return the thread's row (locked for this transaction), None when it is absent."""
        if thread_id in self.rows:
            return self.rows[thread_id]
        known = self._known.get(thread_id) if self._known is not None else None
        row: ThreadRow | None
        if known is not None:
            row = ThreadRow(*known)
        else:
            found = self.conn.execute(self._row_query, (thread_id,)).fetchone()
            row = None
            if found is not None:
                row = ThreadRow(int(found[0]), int(found[1]), loads(found[2]))
        self.rows[thread_id] = row
        return row

    def remember(self, known: dict[str, KnownRow], limit: int) -> None:
        """Record in ``known`` the rows this batch read or wrote, once it is committed (a
        deleted thread is forgotten); keep at most ``limit`` rows, the newest."""
        for thread_id, row in self.rows.items():
            known.pop(thread_id, None)  # re-inserted last: the newest stay
            if row is not None:
                known[thread_id] = (row.last_sequence, row.boundary_sequence, row.metadata)
        while len(known) > limit:
            del known[next(iter(known))]

    def lock(self, thread_ids: Sequence[str]) -> None:
        """Load (and lock) the rows of ``thread_ids`` in sorted order, to avoid deadlocks."""
        for thread_id in sorted(set(thread_ids)):
            self.load(thread_id)

    def _stored(self, payload: bytes) -> Any:
        return payload if self._encode is None else self._encode(payload)

    def _existing(self, thread_id: str) -> ThreadRow:
        row = self.load(thread_id)
        if row is None:
            raise ThreadNotFoundError(thread_id)
        return row

    def _add(self, row: ThreadRow, entries: Sequence[JournalEvent], rows: list[EventRow]) -> None:
        row.pending.extend(rows)
        row.metadata = fold_metadata(row.metadata, entries)
        row.boundary_sequence = last_boundary_sequence(entries, row.boundary_sequence)
        row.last_sequence = entries[-1].sequence
        row.dirty = True

    def _rows(self, first: int, at: int, payloads: Sequence[bytes]) -> list[EventRow]:
        encode = self._encode
        if encode is None:
            return [(first + i, at, payload) for i, payload in enumerate(payloads)]
        return [(first + i, at, encode(payload)) for i, payload in enumerate(payloads)]

    def append(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Append a batch after the row's last sequence (conditionally, when expected)."""
        if len(payloads) != len(events):
            raise ValueError(f"{len(payloads)} payloads for {len(events)} events")
        row = self._existing(thread_id)
        check_expected(thread_id, expected_last_sequence, row.last_sequence)
        now = self._now_ms()
        first = row.last_sequence + 1
        entries = [JournalEvent(first + i, now, event) for i, event in enumerate(events)]
        self._add(row, entries, self._rows(first, now, payloads))
        return entries

    def import_events(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Append journal events verbatim; ``SequenceConflictError`` unless they continue."""
        if len(payloads) != len(entries):
            raise ValueError(f"{len(payloads)} payloads for {len(entries)} events")
        row = self._existing(thread_id)
        check_continues(thread_id, entries, row.last_sequence)
        encode = self._encode
        self._add(
            row,
            entries,
            [
                (
                    entry.sequence,
                    entry.recorded_at_ms,
                    payload if encode is None else encode(payload),
                )
                for entry, payload in zip(entries, payloads, strict=True)
            ],
        )

    def create(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Insert a thread's row; ``ThreadExistsError`` when the id is taken."""
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0, open_turns=())
        raw = dumps(stored)
        thread_id = stored.thread_id
        if self.rows.get(thread_id) is not None:
            raise ThreadExistsError(thread_id)
        inserted = self.conn.execute(
            self._sql(
                "INSERT INTO roder_threads (thread_id, updated_at_ms, last_sequence, "
                "boundary_sequence, metadata) VALUES (?, ?, 0, 0, ?) "
                "ON CONFLICT (thread_id) DO NOTHING"
            ),
            (thread_id, stored.updated_at_ms, self._stored(raw)),
        ).rowcount
        if not inserted:
            raise ThreadExistsError(thread_id)
        self.rows[thread_id] = ThreadRow(0, 0, stored)
        return stored

    def update(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        """Change the thread's title and/or extra; return the new metadata."""
        row = self._existing(thread_id)
        metadata = replace(
            row.metadata, updated_at_ms=max(row.metadata.updated_at_ms, self._now_ms()), **changes
        )
        dumps(metadata)  # refuse what cannot be stored before anything is written
        row.metadata = metadata
        row.dirty = True
        return metadata

    def delete(self, thread_id: str) -> None:
        """Delete the thread's row and its events."""
        self._existing(thread_id)
        self.conn.execute(self._sql("DELETE FROM roder_threads WHERE thread_id = ?"), (thread_id,))
        self.conn.execute(self._sql("DELETE FROM roder_events WHERE thread_id = ?"), (thread_id,))
        self.rows[thread_id] = None

    def flush(self) -> None:
        """Write every changed row: its new events, then its folded metadata."""
        update = self._sql(
            "UPDATE roder_threads SET updated_at_ms = ?, last_sequence = ?, "
            "boundary_sequence = ?, metadata = ?, open_turns = ? WHERE thread_id = ?"
        )
        for thread_id, row in self.rows.items():
            if row is None or not row.dirty:
                continue
            if row.pending:
                self._insert_events(self.conn, thread_id, row.pending)
                row.pending = []
            self.conn.execute(
                update,
                (
                    row.metadata.updated_at_ms,
                    row.last_sequence,
                    row.boundary_sequence,
                    self._stored(dumps(row.metadata)),
                    len(row.metadata.open_turns),
                    thread_id,
                ),
            )
            row.dirty = False


__all__ = ["EventRow", "KnownRow", "SqlConnection", "ThreadRow", "WriteBatch"]
