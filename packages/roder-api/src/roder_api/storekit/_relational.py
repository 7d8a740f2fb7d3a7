"""``RelationalThreadStore``: one SQL thread store, specialised by dialect (SQLite, PostgreSQL).

Two tables hold everything: ``roder_threads`` (a row per thread: its folded metadata, last
sequence and the sequence of its last compaction boundary) and ``roder_events`` (a row per
journal event). Writes run in transactions of :class:`~roder_api.storekit.WriteBatch`;
concurrent appends share one transaction and one commit (:class:`GroupCommit`). A subclass
gives the dialect: how to open a write transaction and a read snapshot, the placeholder,
the row lock, how to insert many event rows, which errors mean "run it again", and the
lease.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import anyio

from roder_api._thread_contract import (
    EventPage,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    Turn,
)
from roder_api.codec import journal_events, loads
from roder_api.errors import RoderError, StoreCorruptedError, ThreadNotFoundError
from roder_api.events import Event, JournalEvent
from roder_api.storekit._blocking import BlockingThreadStore
from roder_api.storekit._checks import check_complete
from roder_api.storekit._cursors import decode_cursor, event_page, thread_page
from roder_api.storekit._fold import replay_after
from roder_api.storekit._group_commit import GroupCommit
from roder_api.storekit._open_turns import PENDING_QUERY
from roder_api.storekit._row_turns import (
    RowsNotWhole,
    turns_from_chunks,
    turns_from_rows,
    window_events,
)
from roder_api.storekit._write_batch import EventRow, KnownRow, SqlConnection, WriteBatch

T = TypeVar("T")

_EVENTS = "SELECT sequence, recorded_at_ms, event FROM roder_events WHERE thread_id = ? "
_ITEMS = "SELECT event FROM roder_events WHERE thread_id = ? "


_KNOWN_LOCK_GUARD = threading.Lock()
"""Guards the first making of a store's ``_known_lock`` (two threads may write at once)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class _Append:
    thread_id: str
    events: list[Event]
    payloads: list[bytes]
    expected: int | None


class RelationalThreadStore(BlockingThreadStore):
    """A thread store in a SQL database; subclasses give the dialect (see the module doc).

    Class attributes: ``placeholder`` (``?`` or ``%s``), ``row_lock`` (appended to the
    query that reads a thread's row in a write transaction: ``" FOR UPDATE"`` where rows
    are locked, ``""`` where the transaction itself is exclusive), ``no_limit`` (the
    ``LIMIT`` value meaning "all"), ``size_function`` (bytes of a payload) and
    ``max_write_attempts`` (how often a write transaction is run again after an error
    :meth:`is_retryable` accepts; nothing of a failed attempt was committed),
    ``joined_events_sql`` (a query of one window of a thread's events joined into one
    document, for :meth:`snapshot_sync`; None: the rows are read one by one).
    """

    open_turns_column: bool = True
    """False when the schema predates the ``open_turns`` column (a read-only open of an
    old store, which may not migrate it): :meth:`threads_with_pending_input` then pages
    through the journals, as the default does."""

    placeholder: ClassVar[str] = "?"
    row_lock: ClassVar[str] = ""
    no_limit: ClassVar[int | None] = -1
    size_function: ClassVar[str] = "length"
    max_write_attempts: ClassVar[int] = 1
    joined_events_sql: ClassVar[str | None] = None
    """Parameters ``(thread_id, after, upto)``: one row of the events ``after < sequence <=
    upto``: in sequence order joined with ``storekit._row_turns.SEPARATOR`` (as bytes), their
    count, and how many do not start with ``{`` (may carry the codec's exact mark). Lets
    :meth:`snapshot_sync` parse a window with one call."""
    joined_window: ClassVar[int] = 512
    """How many events one ``joined_events_sql`` window holds (512-1,024 measured fastest on
    a 50,000-item thread: ~83 ms of thread CPU against ~90 with 4,096, ~122 with 16,384)."""

    keeps_rows: ClassVar[bool] = False
    """True for a dialect whose write transactions run one at a time in a process and
    which gives :meth:`changes_version`: the store then keeps the rows it committed (at
    most ``known_rows_limit`` threads') for the next write transaction."""
    known_rows_limit: ClassVar[int] = 1024

    _appends: GroupCommit[_Append, list[JournalEvent]] | None = None
    _sql_cache: dict[str, str] | None = None
    _known: dict[str, KnownRow] | None = None
    _known_version: object = None
    _known_lock: threading.Lock | None = None

    # --- the dialect ----------------------------------------------------------------------

    @abstractmethod
    def write_transaction(self) -> AbstractContextManager[SqlConnection]:
        """Return a context manager: a connection in a write transaction, committed on exit.

        Rolled back when the block raises. Concurrent write transactions of one thread
        must be ordered (an exclusive transaction, or the ``row_lock``).
        """

    @abstractmethod
    def read_transaction(self) -> AbstractContextManager[SqlConnection]:
        """Return a context manager: a connection reading one consistent snapshot."""

    def is_retryable(self, exc: Exception) -> bool:
        """Return True for a transient conflict after which the transaction is run again."""
        return False

    def changes_version(self, conn: SqlConnection) -> object | None:
        """Return, in a write transaction, a value that differs from the one the last write
        transaction of this store saw whenever another writer has committed since (SQLite's
        ``PRAGMA data_version``), or None (the default) when the dialect cannot tell.

        With a value (and :attr:`keeps_rows`), the store keeps the rows of the threads it
        wrote, as committed, and the next write transaction takes them from memory instead
        of reading them again while the value is unchanged.
        """
        return None

    def encode_payload(self, payload: bytes) -> Any:
        """Return a JSON document (the codec's bytes) as the database column stores it."""
        return payload

    def insert_events(self, conn: SqlConnection, thread_id: str, rows: Sequence[EventRow]) -> None:
        """Insert a thread's new event rows (the default: one ``executemany``)."""
        conn.executemany(
            self.sql(
                "INSERT INTO roder_events (thread_id, sequence, recorded_at_ms, event) "
                "VALUES (?, ?, ?, ?)"
            ),
            [(thread_id, sequence, at, payload) for sequence, at, payload in rows],
        )

    def sql(self, text: str) -> str:
        """Return ``text`` (written with ``?`` placeholders) in the dialect's placeholders."""
        if self.placeholder == "?":
            return text
        cache = self._sql_cache
        if cache is None:
            cache = self._sql_cache = {}
        converted = cache.get(text)
        if converted is None:
            converted = cache[text] = text.replace("?", self.placeholder)
        return converted

    # --- writes ---------------------------------------------------------------------------

    def write(self, work: Callable[[WriteBatch], T]) -> T:
        """Return ``work(batch)`` run and committed in one write transaction.

        The batch's changes are flushed before the commit; after an error
        :meth:`is_retryable` accepts, the whole transaction runs again.
        """
        for attempt in range(1, self.max_write_attempts + 1):
            try:
                return self._write_once(work)
            except Exception as exc:
                if attempt == self.max_write_attempts or not self.is_retryable(exc):
                    raise
                time.sleep(0.005 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _write_once(self, work: Callable[[WriteBatch], T]) -> T:
        if not self.keeps_rows:
            with self.write_transaction() as conn:
                batch = self._batch(conn, None)
                result = work(batch)
                batch.flush()
                return result
        lock = self._known_lock
        if lock is None:
            with _KNOWN_LOCK_GUARD:
                if self._known_lock is None:
                    self._known_lock = threading.Lock()
                lock = self._known_lock
        with lock:
            # The rows known from the last commit are taken out for this transaction and
            # put back only once it has committed: a failed one leaves none behind.
            known, self._known = self._known, None
            with self.write_transaction() as conn:
                version = self.changes_version(conn)
                if version is None:
                    known = None
                elif known is None or version != self._known_version:
                    known = {}
                batch = self._batch(conn, known)
                result = work(batch)
                batch.flush()
            if known is not None:
                batch.remember(known, self.known_rows_limit)
                self._known, self._known_version = known, version
            return result

    def _batch(self, conn: SqlConnection, known: dict[str, KnownRow] | None) -> WriteBatch:
        return WriteBatch(
            conn,
            sql=self.sql,
            row_lock=self.row_lock,
            insert_events=self.insert_events,
            # The default keeps the bytes as they are: no call per event for it.
            encode_payload=(
                None
                if type(self).encode_payload is RelationalThreadStore.encode_payload
                else self.encode_payload
            ),
            now_ms=_now_ms,
            known=known,
        )

    def fence(self, conn: SqlConnection, thread_id: str) -> None:
        """Check, in an append's transaction, that this store may still write the thread.

        Called before every append's own SQL (rows locked already). A store whose leases
        can be lost while their holder runs (PostgreSQL: the lease's connection ends)
        raises :class:`~roder_api.errors.LeaseLostError` here for a thread whose lease it
        held and lost; the default checks nothing.
        """

    def _append_group(self, items: list[_Append]) -> list[list[JournalEvent] | BaseException]:
        """Commit a group of appends in one transaction; a refused one fails alone."""

        def work(batch: WriteBatch) -> list[list[JournalEvent] | BaseException]:
            batch.lock([item.thread_id for item in items])
            outcomes: list[list[JournalEvent] | BaseException] = []
            for item in items:
                try:
                    self.fence(batch.conn, item.thread_id)
                    outcomes.append(
                        batch.append(item.thread_id, item.events, item.payloads, item.expected)
                    )
                except RoderError as exc:  # checked before any SQL of this append ran
                    outcomes.append(exc)
            return outcomes

        return self.write(work)

    async def submit_append(
        self,
        thread_id: str,
        events: list[Event],
        payloads: list[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Commit the batch together with the appends that arrive meanwhile (group commit)."""
        if self._appends is None:
            self._appends = GroupCommit(self._append_group)
        try:
            return await self._appends.submit(
                _Append(thread_id, events, payloads, expected_last_sequence)
            )
        except Exception as exc:
            translated = self.translate_error(exc)
            if translated is None:
                raise
            raise translated from exc

    async def aclose(self) -> None:
        """Close the store once the group commit wrote what it was handed, and ended."""
        appends = self._appends
        if appends is not None and not self.closed:
            with anyio.CancelScope(shield=True):
                await self.run_sync(appends.close)
        await super().aclose()

    def append_sync(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Append one batch in a transaction of its own."""

        def work(batch: WriteBatch) -> list[JournalEvent]:
            batch.lock([thread_id])
            self.fence(batch.conn, thread_id)
            return batch.append(thread_id, events, payloads, expected_last_sequence)

        return self.write(work)

    def create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create the thread's row."""
        return self.write(lambda batch: batch.create(metadata))

    def create_with_events_sync(
        self, metadata: ThreadMetadata, events: Sequence[Event], payloads: Sequence[bytes]
    ) -> list[JournalEvent]:
        """Create the thread's row and append its first events in one transaction."""

        def work(batch: WriteBatch) -> list[JournalEvent]:
            batch.create(metadata)
            self.fence(batch.conn, metadata.thread_id)
            return batch.append(metadata.thread_id, events, payloads, None)

        return self.write(work)

    def update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        """Change the thread's title and/or extra."""
        return self.write(lambda batch: batch.update(thread_id, changes))

    def import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Append journal events verbatim."""
        self.write(lambda batch: batch.import_events(thread_id, entries, payloads))

    def delete_sync(self, thread_id: str) -> None:
        """Delete the thread and its events."""
        self.write(lambda batch: batch.delete(thread_id))

    # --- reads ----------------------------------------------------------------------------

    def _row(self, conn: SqlConnection, thread_id: str) -> tuple[int, int, Any]:
        found = conn.execute(
            self.sql(
                "SELECT last_sequence, boundary_sequence, metadata FROM roder_threads "
                "WHERE thread_id = ?"
            ),
            (thread_id,),
        ).fetchone()
        if found is None:
            raise ThreadNotFoundError(thread_id)
        return int(found[0]), int(found[1]), found[2]

    @staticmethod
    def _events(thread_id: str, rows: Iterable[Any]) -> list[JournalEvent]:
        return journal_events(rows, thread_id=thread_id)

    def get_sync(self, thread_id: str) -> ThreadMetadata:
        """Return the thread's metadata."""
        with self.read_transaction() as conn:
            metadata: ThreadMetadata = loads(self._row(conn, thread_id)[2])
        return metadata

    def read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        """Return the events above ``after`` (from the last boundary on when ``replay``)."""
        with self.read_transaction() as conn:
            last, boundary, _ = self._row(conn, thread_id)
            if replay:
                after = max(after, replay_after(boundary))
            params: tuple[int | None, ...]
            if limit is None:
                query, params = "AND sequence > ? ORDER BY sequence LIMIT ?", (after, self.no_limit)
            else:
                # Sequences are consecutive, so the upper bound changes no answer; it keeps
                # a planner without statistics (a thread just written) from sorting the
                # whole rest of the thread for every chunk of Runtime.load_thread.
                query = "AND sequence > ? AND sequence <= ? ORDER BY sequence LIMIT ?"
                params = (after, after + limit, limit)
            cursor = conn.execute(self.sql(_EVENTS + query), (thread_id, *params))
            # Decoded straight from the cursor: no list of every row next to the events.
            events = self._events(thread_id, cursor)
        # Checked against the thread's row: a deleted event row is damage, not a short read.
        end = last if limit is None else min(last, after + limit)
        check_complete(thread_id, events, after + 1, end)
        return events

    def snapshot_sync(self, thread_id: str) -> ThreadSnapshot:
        """Return the metadata and the items by turn from one read transaction and one query.

        Each row is decoded straight to its transcript item (:func:`turns_from_rows`), not to
        a journal event folded afterwards. Rows that are not whole (one does not decode, one
        is missing) are read again the general way, whose damage error names the sequence.
        """
        with self.read_transaction() as conn:
            last, _, metadata = self._row(conn, thread_id)
            # Bounded above, as read_sync's chunks are: the planner stays on the index.
            window = "AND sequence > ? AND sequence <= ? ORDER BY sequence LIMIT ?"
            params = (thread_id, 0, last, last)
            turns = self._joined_turns(conn, thread_id, last)
            if turns is not None:
                return ThreadSnapshot(loads(metadata), turns)
            try:
                turns = turns_from_rows(conn.execute(self.sql(_ITEMS + window), params), last)
            except RowsNotWhole as exc:
                events = self._events(thread_id, conn.execute(self.sql(_EVENTS + window), params))
                check_complete(thread_id, events, 1, last)
                raise StoreCorruptedError(
                    f"thread {thread_id!r} is damaged: {exc}; nothing was changed",
                    thread_id=thread_id,
                ) from None
            return ThreadSnapshot(loads(metadata), turns)

    def _joined_turns(
        self, conn: SqlConnection, thread_id: str, last: int
    ) -> tuple[Turn, ...] | None:
        """Return the items by turn from :attr:`joined_events_sql` windows, or None when the
        dialect has none or the windows cannot be vouched for (then rows are read one by
        one)."""
        query = self.joined_events_sql
        if query is None:
            return None
        sql, step = self.sql(query), self.joined_window

        def windows() -> Iterator[list[Any] | None]:
            for after in range(0, last, step):
                joined, count, marked = conn.execute(
                    sql, (thread_id, after, after + step)
                ).fetchone()
                if count != min(step, last - after):
                    yield None
                    return
                yield window_events(joined, count, marked)

        return turns_from_chunks(windows(), last)

    def page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        """Return up to ``limit`` events below ``before``, ascending."""
        with self.read_transaction() as conn:
            last, _, _ = self._row(conn, thread_id)
            if before is None:
                before = last + 1
            rows = conn.execute(
                self.sql(_EVENTS + "AND sequence < ? ORDER BY sequence DESC LIMIT ?"),
                (thread_id, before, limit),
            ).fetchall()
        events = self._events(thread_id, rows[::-1])
        check_complete(thread_id, events, max(1, before - limit), min(before - 1, last))
        return event_page(events, before)

    def list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        """Return a page of threads, newest update first."""
        order = "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?"
        if cursor:
            updated, after_id = decode_cursor(cursor)
            query = "SELECT metadata FROM roder_threads WHERE (updated_at_ms, thread_id) < (?, ?) "
            params: tuple[Any, ...] = (updated, after_id, limit + 1)
        else:
            query, params = "SELECT metadata FROM roder_threads ", (limit + 1,)
        with self.read_transaction() as conn:
            rows = conn.execute(self.sql(query + order), params).fetchall()
        return thread_page([loads(raw) for (raw,) in rows], limit)

    async def threads_with_pending_input(
        self, *, updated_after_ms: int = 0, limit: int = 100
    ) -> list[str]:
        """Return the threads with an open turn: one query of the ``open_turns`` column's
        partial index (see :meth:`ThreadStore.threads_with_pending_input`)."""
        if not self.open_turns_column:
            return await super().threads_with_pending_input(
                updated_after_ms=updated_after_ms, limit=limit
            )
        return await self.run_sync(self.pending_sync, updated_after_ms, limit)

    def pending_sync(self, updated_after_ms: int, limit: int) -> list[str]:
        """Return the ids of threads with an open turn, newest update first."""
        with self.read_transaction() as conn:
            rows = conn.execute(self.sql(PENDING_QUERY), (updated_after_ms, limit)).fetchall()
        return [str(thread_id) for (thread_id,) in rows]

    def size_sync(self, thread_id: str) -> int:
        """Return the bytes of the thread's metadata and events as stored."""
        with self.read_transaction() as conn:
            _, _, raw = self._row(conn, thread_id)
            found = conn.execute(
                self.sql(
                    f"SELECT coalesce(sum({self.size_function}(event)), 0) FROM roder_events "
                    "WHERE thread_id = ?"
                ),
                (thread_id,),
            ).fetchone()
        size = len(raw.encode()) if isinstance(raw, str) else len(raw)
        return size + (int(found[0]) if found is not None else 0)


__all__ = ["RelationalThreadStore"]
