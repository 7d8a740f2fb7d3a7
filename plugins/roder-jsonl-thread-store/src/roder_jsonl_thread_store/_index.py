"""The listing index: one row per thread in a small SQLite file next to the journals.

The journals are the truth; the index is a cache that makes three things cheap: the first page
of a listing (a range scan of ``(updated_at_ms, thread_id)``), the metadata of a thread
(usage, counts, title) and where its last compaction boundary starts, all without reading its
journal. Each row also records how much of the journal it covers (``size``, ``lines``) and
which file that was (``inode``, ``head_crc``: the checksum of the first line), so a store
reading a row can tell whether the journal has grown since (it reads only the new tail) or was
replaced (it rescans).

The index is written with ``synchronous=NORMAL`` in WAL mode: consistent after a crash, but
the newest rows may be lost, which the catch-up after a crash repairs (see ``_core``). A
damaged or unreadable index file is set aside and rebuilt from the journals.

A store that may not write its directory keeps the index in memory instead
(:meth:`ThreadIndex.open_in_memory`): a copy of the file when it can be read, else empty,
and caught up from the journals like a new one. Nothing on disk changes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

INDEX_VERSION = 2
"""The version of the index schema; an index of another version is rebuilt (version 2 added
``open_turns``, so an index of version 1 is rebuilt once, from the journals)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (
    thread_id TEXT PRIMARY KEY,
    updated_at_ms INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    size INTEGER NOT NULL,
    lines INTEGER NOT NULL,
    head_crc INTEGER NOT NULL,
    boundary_offset INTEGER NOT NULL,
    boundary_sequence INTEGER NOT NULL,
    meta BLOB NOT NULL,
    open_turns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS threads_by_update ON threads (updated_at_ms, thread_id);
CREATE INDEX IF NOT EXISTS threads_open ON threads (updated_at_ms, thread_id)
    WHERE open_turns > 0;
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What the index knows of one journal."""

    thread_id: str
    updated_at_ms: int
    inode: int
    size: int
    lines: int
    head_crc: int
    boundary_offset: int
    boundary_sequence: int
    meta: bytes
    open_turns: int = 0
    """How many turns of the journal are open (``ThreadMetadata.open_turns``)."""

    def values(self) -> tuple[Any, ...]:
        """Return the row's column values in table order."""
        return (
            self.thread_id,
            self.updated_at_ms,
            self.inode,
            self.size,
            self.lines,
            self.head_crc,
            self.boundary_offset,
            self.boundary_sequence,
            self.meta,
            self.open_turns,
        )


class PendingRow(Protocol):
    """A row deferred to be written later (:meth:`ThreadIndex.defer`): an :class:`IndexRow`,
    or anything that makes its values only when they are written."""

    @property
    def thread_id(self) -> str:
        """The thread the row is of (a newer row of the same thread replaces it)."""
        ...

    def values(self) -> tuple[Any, ...] | None:
        """Return the row's column values in table order (None: it is stale, skip it)."""
        ...


class IndexUnavailable(Exception):
    """Raised when the index file cannot be opened or read; the caller rebuilds it."""


class IndexOutdated(IndexUnavailable):
    """Raised when the index file is of an older version: an upgrade, not damage."""


class ThreadIndex:
    """The SQLite listing index of one store; safe for many threads and processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.created = False
        # Rows deferred by a writer (``defer``), by thread: written before the index is next
        # used, so every reader of this object sees them. Their own lock, so that deferring
        # never waits for a query.
        self._pending: dict[str, PendingRow] = {}
        self._pending_lock = threading.Lock()
        self.dropped = False
        """True once deferred rows could not be written (the index is behind the journals)."""

    def open(self) -> None:
        """Open (creating if needed) the index; raise ``IndexUnavailable`` when it is bad."""
        with self._lock:
            if self._db is not None:
                return
            existed = self.path.exists()
            try:
                db = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=60.0
                )
            except sqlite3.Error as exc:
                raise IndexUnavailable(str(exc)) from exc
            try:
                db.execute("PRAGMA synchronous=NORMAL")
                row = None
                if existed:
                    try:
                        row = db.execute("SELECT value FROM info WHERE key = 'version'").fetchone()
                    except sqlite3.OperationalError:
                        row = None  # no schema yet
                if row is None:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.executescript(_SCHEMA)
                    db.execute(
                        "INSERT OR IGNORE INTO info VALUES ('version', ?)", (str(INDEX_VERSION),)
                    )
                    existed = False
                elif row[0] != str(INDEX_VERSION):
                    why = f"index version {row[0]} is not {INDEX_VERSION}"
                    if str(row[0]).isdigit() and int(row[0]) < INDEX_VERSION:
                        raise IndexOutdated(why)
                    raise IndexUnavailable(why)
                db.execute("SELECT count(*) FROM threads WHERE 0").fetchone()
            except IndexOutdated:
                db.close()
                raise
            except (sqlite3.Error, IndexUnavailable) as exc:
                db.close()
                raise IndexUnavailable(str(exc)) from exc
            self._db = db
            self.created = not existed

    def open_in_memory(self) -> None:
        """Open an in-memory index: a copy of the index file when it can be read, else empty.

        ``created`` says whether it starts empty. Either way the caller catches it up from
        the journals (the copy skips what only the WAL holds). Never writes to the file or
        its directory.
        """
        with self._lock:
            if self._db is not None:
                return
            db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            copied = False
            if self.path.exists():
                try:
                    # immutable: no lock, no -shm or -wal made, the WAL not read. The copy may
                    # miss the newest rows; the caller catches it up from the journals.
                    source = sqlite3.connect(f"{self.path.as_uri()}?immutable=1", uri=True)
                    try:
                        row = source.execute(
                            "SELECT value FROM info WHERE key = 'version'"
                        ).fetchone()
                        if row is not None and row[0] == str(INDEX_VERSION):
                            source.backup(db)
                            copied = True
                    finally:
                        source.close()
                except sqlite3.Error:
                    # Unreadable here (no -shm can be made, say): build it anew.
                    db.close()
                    db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                    copied = False
            if not copied:
                db.executescript(_SCHEMA)
                db.execute(
                    "INSERT OR IGNORE INTO info VALUES ('version', ?)", (str(INDEX_VERSION),)
                )
            self._db = db
            self.created = not copied

    def close(self) -> None:
        """Write the deferred rows, then close the index connection."""
        with self._lock:
            if self._db is not None and self._pending:
                try:
                    self._write_pending(self._db)
                except sqlite3.DatabaseError:
                    pass  # ``dropped`` says so
            db, self._db = self._db, None
            if db is not None:
                db.close()

    @contextmanager
    def _cursor(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._db is None:
                raise IndexUnavailable("the index is closed")
            try:
                if self._pending:
                    self._write_pending(self._db)
                yield self._db
            except sqlite3.DatabaseError as exc:
                raise IndexUnavailable(str(exc)) from exc

    def defer(self, rows: Iterable[PendingRow]) -> None:
        """Queue rows to insert or replace: they are written before the index is next used
        (any call of this object) or by :meth:`flush`, a thread's newest row last.

        For a writer that wakes its callers first: the journal is the truth, and a row
        that a crash loses is caught up from it (see ``_core``).
        """
        with self._pending_lock:
            for row in rows:
                self._pending[row.thread_id] = row

    def flush(self) -> None:
        """Write the deferred rows now (``IndexUnavailable`` when that fails)."""
        if self._pending:
            with self._cursor():
                pass

    def _write_pending(self, db: sqlite3.Connection) -> None:
        """Write the deferred rows in one transaction; hold ``_lock``."""
        with self._pending_lock:  # taken, not made, under it: a row's values stat a file
            rows, self._pending = list(self._pending.values()), {}
        try:
            made = [row.values() for row in rows]
            self._put_values(db, [values for values in made if values is not None])
        except BaseException:
            self.dropped = True
            raise

    def get(self, thread_id: str) -> IndexRow | None:
        """Return the row of a thread, or None."""
        with self._cursor() as db:
            row = db.execute("SELECT * FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
        return IndexRow(*row) if row is not None else None

    def put(self, rows: Iterable[IndexRow]) -> None:
        """Insert or replace rows, in one transaction."""
        values = [row.values() for row in rows]
        if not values:
            return
        with self._cursor() as db:
            self._put_values(db, values)

    @staticmethod
    def _put_values(db: sqlite3.Connection, values: list[tuple[Any, ...]]) -> None:
        if not values:
            return
        if len(values) == 1:
            db.execute("INSERT OR REPLACE INTO threads VALUES (?,?,?,?,?,?,?,?,?,?)", values[0])
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO threads VALUES (?,?,?,?,?,?,?,?,?,?)", values)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def refresh(self, row: IndexRow, inode: int, size: int) -> bool:
        """Replace a thread's row unless it changed from ``(inode, size)``; return True if so.

        For a reader that rescanned a journal: a writer that updated the row meanwhile
        knows better, and its row stays.
        """
        with self._cursor() as db:
            cursor = db.execute(
                "UPDATE threads SET updated_at_ms = ?, inode = ?, size = ?, lines = ?, "
                "head_crc = ?, boundary_offset = ?, boundary_sequence = ?, meta = ?, "
                "open_turns = ? "
                "WHERE thread_id = ? AND inode = ? AND size = ?",
                (*row.values()[1:], row.thread_id, inode, size),
            )
            return cursor.rowcount > 0

    def make_durable(self) -> None:
        """Sync every committed row to disk (rows are otherwise synced at checkpoints only).

        One write at ``synchronous=FULL`` syncs the write-ahead log, and with it every
        transaction before it.
        """
        with self._cursor() as db:
            db.execute("PRAGMA synchronous=FULL")
            try:
                db.execute("INSERT OR REPLACE INTO info VALUES ('synced', 'yes')")
            finally:
                db.execute("PRAGMA synchronous=NORMAL")

    def delete(self, thread_id: str) -> None:
        """Remove a thread's row (nothing when there is none)."""
        with self._cursor() as db:
            db.execute("DELETE FROM threads WHERE thread_id = ?", (thread_id,))

    def replace_all(self, rows: Iterable[IndexRow]) -> None:
        """Replace every row with ``rows``, in one transaction."""
        with self._cursor() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM threads")
                db.executemany(
                    "INSERT OR REPLACE INTO threads VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (row.values() for row in rows),
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def page(self, before: tuple[int, str] | None, limit: int) -> list[IndexRow]:
        """Return up to ``limit`` rows newest first, strictly after the cursor ``before``."""
        with self._cursor() as db:
            if before is None:
                cursor = db.execute(
                    "SELECT * FROM threads ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?",
                    (limit,),
                )
            else:
                cursor = db.execute(
                    "SELECT * FROM threads WHERE (updated_at_ms, thread_id) < (?, ?) "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?",
                    (before[0], before[1], limit),
                )
            return [IndexRow(*row) for row in cursor.fetchall()]

    def pending(self, updated_after_ms: int, limit: int) -> list[str]:
        """Return the threads with an open turn updated at or after ``updated_after_ms``,
        newest first (the partial index ``threads_open``)."""
        with self._cursor() as db:
            rows = db.execute(
                "SELECT thread_id FROM threads WHERE open_turns > 0 AND updated_at_ms >= ? "
                "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?",
                (updated_after_ms, limit),
            ).fetchall()
        return [row[0] for row in rows]

    def sizes(self) -> dict[str, tuple[int, int, int]]:
        """Return ``thread_id -> (inode, size, head_crc)`` for every row."""
        with self._cursor() as db:
            rows = db.execute("SELECT thread_id, inode, size, head_crc FROM threads").fetchall()
        return {row[0]: (row[1], row[2], row[3]) for row in rows}
