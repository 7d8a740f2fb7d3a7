"""The SQLite thread store: every thread of a store in one SQLite file, in WAL mode."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio.to_thread

from roder_api.codec import dumps, from_dict, loads_json
from roder_api.errors import (
    SequenceConflictError,
    StoppedError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
)
from roder_api.events import Event, JournalEvent
from roder_api.inference import TokenUsage
from roder_api.storekit import (
    BlockingThreadStore,
    check_expected,
    decode_cursor,
    encode_cursor,
    fold_metadata,
    last_boundary_sequence,
    listing_key,
)
from roder_api.threads import EventPage, ThreadMetadata, ThreadPage, ThreadStoreFactory

T = TypeVar("T")

SCHEMA_VERSION = 1
"""The schema version this code writes (kept in ``PRAGMA user_version``)."""

# Each entry migrates the schema from version ``index`` to ``index + 1``; never edit a
# released entry, append a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE roder_threads (
            thread_id TEXT PRIMARY KEY,
            updated_at_ms INTEGER NOT NULL,
            last_sequence INTEGER NOT NULL,
            boundary_sequence INTEGER NOT NULL,
            metadata BLOB NOT NULL
        )
        """,
        "CREATE INDEX roder_threads_by_update ON roder_threads (updated_at_ms, thread_id)",
        """
        CREATE TABLE roder_events (
            thread_id TEXT NOT NULL,
            sequence INTEGER NOT NULL,
            recorded_at_ms INTEGER NOT NULL,
            event BLOB NOT NULL,
            PRIMARY KEY (thread_id, sequence)
        ) WITHOUT ROWID
        """,
    ),
)

DURABILITY_MODES: Mapping[str, str] = {
    "fsync": "FULL",
    "group": "FULL",
    "normal": "NORMAL",
    "none": "OFF",
}
"""``durability`` setting -> ``PRAGMA synchronous``. ``fsync`` (and ``group``, the same here:
each WAL commit is synced) survives power loss; ``normal`` survives a process crash; ``none``
leaves syncing to the OS."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class _WriteRequest(Generic[T]):
    """One writer's work waiting for a group commit, and its outcome."""

    __slots__ = ("work", "done", "result", "error")

    def __init__(self, work: Callable[[sqlite3.Connection], T]) -> None:
        self.work = work
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def outcome(self) -> T:
        """Return the committed result, or raise the error of this piece of work."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # set whenever error is None


class SqliteThreadStore(BlockingThreadStore):
    """A thread store in one SQLite file: a ``roder_threads`` row per thread (its metadata,
    folded on every append) and a ``roder_events`` row per journal event.

    Writers in this process share one connection and commit in groups (concurrent appends
    share one transaction and one sync, each still committed before it returns); readers
    use a small pool of connections, which WAL lets read while a write is in progress.
    Several processes may open the same file: ``BEGIN IMMEDIATE`` and the busy timeout
    order their writes.
    """

    def __init__(
        self, path: Path, *, durability: str = "fsync", busy_timeout_s: float = 30.0
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.path = path
        self.durability = durability
        self.busy_timeout_s = busy_timeout_s
        self._write_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: list[_WriteRequest[Any]] = []
        self._pool_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._writer: sqlite3.Connection | None = None

    # --- connections ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN / COMMIT ourselves (BEGIN IMMEDIATE for writes).
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA synchronous = {DURABILITY_MODES[self.durability]}")
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _warm(self) -> None:
        """Open the first reader connection now, so the first read does not pay for it."""
        conn = self._connect()
        with self._pool_lock:
            self._readers.append(conn)

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        with self._pool_lock:
            if self.closed:
                raise StoppedError("the SQLite thread store is closed; open a new one")
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            conn = self._connect()
        try:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")
        finally:
            with self._pool_lock:
                if self.closed:
                    conn.close()
                else:
                    self._readers.append(conn)

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` in a committed write transaction, grouped with concurrent writes.

        Group commit: every writer queues its work, then takes the write lock. The holder
        runs everything queued so far in one ``BEGIN IMMEDIATE`` transaction, each piece
        under its own SAVEPOINT (a failing piece is rolled back alone and gets its error),
        and commits once: one sync for many writes. A writer whose work a previous holder
        already committed just returns its result. Nothing returns before its COMMIT.
        """
        request: _WriteRequest[T] = _WriteRequest(work)
        with self._pending_lock:
            self._pending.append(request)
        with self._write_lock:
            if not request.done:
                with self._pending_lock:
                    group, self._pending = self._pending, []
                self._commit_group(group)
        return request.outcome()

    def _commit_group(self, group: list[_WriteRequest[Any]]) -> None:
        """Run and commit a group of queued writes (call with the write lock held)."""
        try:
            if self.closed:
                raise StoppedError("the SQLite thread store is closed; open a new one")
            if self._writer is None:
                self._writer = self._connect()
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                for request in group:
                    conn.execute("SAVEPOINT roder_write")
                    try:
                        request.result = request.work(conn)
                    except Exception as exc:  # noqa: BLE001 - handed to its own writer
                        conn.execute("ROLLBACK TO roder_write")
                        request.error = exc
                    conn.execute("RELEASE roder_write")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except BaseException as exc:
            # Nothing of the group was committed: every writer in it gets the error.
            for request in group:
                request.result, request.error = None, exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for request in group:
                request.done = True

    store_name = "SQLite thread store"

    def translate_error(self, exc: Exception) -> Exception | None:
        """Return a ``StoreError`` for a ``sqlite3.Error``."""
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"SQLite thread store {self.path}: {exc}")
        return None

    # --- blocking work --------------------------------------------------------------------

    @staticmethod
    def _row(conn: sqlite3.Connection, thread_id: str) -> tuple[int, int, bytes]:
        row = conn.execute(
            "SELECT last_sequence, boundary_sequence, metadata FROM roder_threads "
            "WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        if row is None:
            raise ThreadNotFoundError(thread_id)
        return int(row[0]), int(row[1]), bytes(row[2])

    @staticmethod
    def _store_metadata(
        conn: sqlite3.Connection, metadata: ThreadMetadata, boundary_sequence: int
    ) -> None:
        conn.execute(
            "UPDATE roder_threads SET updated_at_ms = ?, last_sequence = ?, "
            "boundary_sequence = ?, metadata = ? WHERE thread_id = ?",
            (
                metadata.updated_at_ms,
                metadata.last_sequence,
                boundary_sequence,
                dumps(metadata),
                metadata.thread_id,
            ),
        )

    def _insert(
        self,
        conn: sqlite3.Connection,
        thread_id: str,
        entries: Sequence[JournalEvent],
        payloads: Sequence[bytes],
        previous_boundary: int,
        metadata: ThreadMetadata,
    ) -> None:
        conn.executemany(
            "INSERT INTO roder_events (thread_id, sequence, recorded_at_ms, event) "
            "VALUES (?, ?, ?, ?)",
            [
                (thread_id, entry.sequence, entry.recorded_at_ms, payload)
                for entry, payload in zip(entries, payloads, strict=True)
            ],
        )
        folded = fold_metadata(metadata, entries)
        self._store_metadata(conn, folded, last_boundary_sequence(entries, previous_boundary))

    def create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0)

        def work(conn: sqlite3.Connection) -> ThreadMetadata:
            inserted = conn.execute(
                "INSERT INTO roder_threads (thread_id, updated_at_ms, last_sequence, "
                "boundary_sequence, metadata) VALUES (?, ?, 0, 0, ?) "
                "ON CONFLICT (thread_id) DO NOTHING",
                (stored.thread_id, stored.updated_at_ms, dumps(stored)),
            ).rowcount
            if not inserted:
                raise ThreadExistsError(stored.thread_id)
            return stored

        return self._write(work)

    def append_sync(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:

        def work(conn: sqlite3.Connection) -> list[JournalEvent]:
            # Inside BEGIN IMMEDIATE: no other connection can write between check and insert.
            last, boundary, raw = self._row(conn, thread_id)
            check_expected(thread_id, expected_last_sequence, last)
            now = _now_ms()
            entries = [JournalEvent(last + 1 + i, now, e) for i, e in enumerate(events)]
            self._insert(conn, thread_id, entries, payloads, boundary, from_dict(loads_json(raw)))
            return entries

        return self._write(work)

    def import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:

        def work(conn: sqlite3.Connection) -> None:
            last, boundary, raw = self._row(conn, thread_id)
            if entries[0].sequence != last + 1:
                raise SequenceConflictError(thread_id, last + 1, entries[0].sequence)
            self._insert(conn, thread_id, entries, payloads, boundary, from_dict(loads_json(raw)))

        self._write(work)

    def update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:

        def work(conn: sqlite3.Connection) -> ThreadMetadata:
            _, boundary, raw = self._row(conn, thread_id)
            metadata: ThreadMetadata = from_dict(loads_json(raw))
            updated = max(metadata.updated_at_ms, _now_ms())
            metadata = replace(metadata, updated_at_ms=updated, **changes)
            self._store_metadata(conn, metadata, boundary)
            return metadata

        return self._write(work)

    def delete_sync(self, thread_id: str) -> None:

        def work(conn: sqlite3.Connection) -> None:
            deleted = conn.execute(
                "DELETE FROM roder_threads WHERE thread_id = ?", (thread_id,)
            ).rowcount
            if not deleted:
                raise ThreadNotFoundError(thread_id)
            conn.execute("DELETE FROM roder_events WHERE thread_id = ?", (thread_id,))

        self._write(work)

    def get_sync(self, thread_id: str) -> ThreadMetadata:
        with self._reader() as conn:
            metadata: ThreadMetadata = from_dict(loads_json(self._row(conn, thread_id)[2]))
            return metadata

    def read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        with self._reader() as conn:
            _, boundary, _ = self._row(conn, thread_id)
            if replay:
                after = max(after, boundary - 1)
            rows = conn.execute(
                "SELECT sequence, recorded_at_ms, event FROM roder_events "
                "WHERE thread_id = ? AND sequence > ? ORDER BY sequence LIMIT ?",
                (thread_id, after, -1 if limit is None else limit),
            ).fetchall()
        return [JournalEvent(seq, t, from_dict(loads_json(raw))) for seq, t, raw in rows]

    def page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        with self._reader() as conn:
            last, _, _ = self._row(conn, thread_id)
            if before is None:
                before = last + 1
            rows = conn.execute(
                "SELECT sequence, recorded_at_ms, event FROM roder_events "
                "WHERE thread_id = ? AND sequence < ? ORDER BY sequence DESC LIMIT ?",
                (thread_id, before, limit),
            ).fetchall()
        events = tuple(
            JournalEvent(seq, t, from_dict(loads_json(raw))) for seq, t, raw in reversed(rows)
        )
        first = events[0].sequence if events else before
        return EventPage(events, first if first > 1 else None)

    def list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        with self._reader() as conn:
            if cursor:
                updated, after_id = decode_cursor(cursor)
                rows = conn.execute(
                    "SELECT metadata FROM roder_threads WHERE (updated_at_ms, thread_id) < (?, ?) "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?",
                    (updated, after_id, limit + 1),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT metadata FROM roder_threads "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?",
                    (limit + 1,),
                ).fetchall()
        threads = [from_dict(loads_json(raw)) for (raw,) in rows]
        page = threads[:limit]
        more = len(threads) > limit
        return ThreadPage(tuple(page), encode_cursor(*listing_key(page[-1])) if more else None)

    def size_sync(self, thread_id: str) -> int:
        with self._reader() as conn:
            _, _, raw = self._row(conn, thread_id)
            row = conn.execute(
                "SELECT coalesce(sum(length(event)), 0) FROM roder_events WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
        return len(raw) + int(row[0])

    def close_sync(self) -> None:
        """Close the connections once the writes in progress are done."""
        with self._write_lock, self._pool_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
            if self._writer is not None:
                self._writer.close()
                self._writer = None


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`, in one IMMEDIATE transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path} has SQLite store schema version {version}, written by a newer Roder "
                f"(this one knows up to {SCHEMA_VERSION}); upgrade roder-sqlite-thread-store"
            )
        for index in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
            # PRAGMA takes no parameters; the value is our own integer.
            conn.execute(f"PRAGMA user_version = {index + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class SqliteThreadStoreFactory(ThreadStoreFactory):
    """Opens SQLite thread stores in the file ``path`` (created with its schema on first use).

    ``durability``: ``fsync`` (default), ``normal`` or ``none`` (see :data:`DURABILITY_MODES`);
    ``busy_timeout_s``: how long a write waits for another process's write.
    """

    id = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        busy_timeout_s: float = 30.0,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.path = Path(path).expanduser()
        self.durability = durability
        self.busy_timeout_s = busy_timeout_s

    def _prepare(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"{self.path}: SQLite refused WAL mode (got {mode!r}); put the store on a "
                    "local file system"
                )
            _migrate(conn, self.path)
        finally:
            conn.close()

    async def open(self) -> SqliteThreadStore:
        """Return a store on ``path``, creating the file and migrating its schema."""
        store = SqliteThreadStore(
            self.path, durability=self.durability, busy_timeout_s=self.busy_timeout_s
        )

        def prepare() -> None:
            self._prepare()
            store._warm()

        try:
            await anyio.to_thread.run_sync(prepare)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot use {self.path} for the SQLite thread store: {exc}") from exc
        return store

    def describe(self) -> str:
        """Return where the database file is."""
        return f"sqlite at {self.path} (durability {self.durability})"
