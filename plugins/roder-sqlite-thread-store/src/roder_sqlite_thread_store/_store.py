"""The SQLite thread store: every thread of a store in one SQLite file, in WAL mode.

The store is ``roder_api.storekit``'s relational store in the SQLite dialect: write
transactions are ``BEGIN IMMEDIATE`` (one writer at a time across processes, the busy
timeout ordering them), reads are deferred transactions on a small pool of connections
(WAL lets them read while a write is in progress), and leases are ``flock`` locks on lease
files beside the database (``<file>.leases/``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from urllib.parse import quote

from roder_api.errors import StoreError
from roder_api.storekit import (
    OPEN_TURNS_DDL,
    EventRow,
    FileLeases,
    RelationalThreadStore,
    backfill_open_turns,
    run_in_worker,
)
from roder_api.threads import ThreadLease, ThreadStoreFactory, validate_thread_id

SCHEMA_VERSION = 2
"""The schema version this code writes (kept in ``PRAGMA user_version``)."""

OPEN_TURNS_VERSION = 2
"""The schema version that added the ``open_turns`` column (filled once when migrated)."""

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
    # The count of each thread's open turns, indexed where above zero: the store query of
    # threads_with_pending_input. _migrate fills it for the threads already stored.
    OPEN_TURNS_DDL,
)

DURABILITY_MODES: Mapping[str, str] = {
    "fsync": "FULL",
    "group": "FULL",
    "normal": "NORMAL",
    "none": "OFF",
}
"""``durability`` setting -> ``PRAGMA synchronous``. ``fsync`` (and ``group``, the same here:
each WAL commit is synced, and concurrent appends share a commit) survives power loss;
``normal`` survives a process crash; ``none`` leaves syncing to the OS."""


def _check_durability(durability: str) -> None:
    if durability not in DURABILITY_MODES:
        raise ValueError(
            f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
        )


def leases_directory(path: Path) -> Path:
    """Return the directory of a database's lease files (``<file>.leases`` beside it)."""
    return path.with_name(path.name + ".leases")


# One window of events joined for RelationalThreadStore.snapshot_sync; ``event < X'7B'``
# counts the rows that do not start with "{" (a BLOB below "{": the codec's exact mark).
if sqlite3.sqlite_version_info >= (3, 44, 0):
    # An ordered aggregate: the order is the query's, not the plan's.
    _JOINED_EVENTS = (
        "SELECT CAST(group_concat(event, ',null,' ORDER BY sequence) AS BLOB), count(*), "
        "sum(event < X'7B') FROM roder_events WHERE thread_id = ? AND sequence > ? "
        "AND sequence <= ?"
    )
else:
    # Older SQLite: an aggregate over a subquery keeps the subquery's ORDER BY (a subquery
    # with ORDER BY is not flattened into an aggregate query).
    _JOINED_EVENTS = (
        "SELECT CAST(group_concat(event, ',null,') AS BLOB), count(*), sum(event < X'7B') "
        "FROM (SELECT event FROM roder_events WHERE thread_id = ? AND sequence > ? "
        "AND sequence <= ? ORDER BY sequence)"
    )


_INSERT_CHUNK = 64
"""The most event rows one ``INSERT`` statement takes (3 parameters a row and the thread
id: 193, under the 999 of older SQLite builds); larger batches take several."""


def _insert_sql(count: int) -> str:
    # The thread id is bound once (?1); each row binds its sequence, time and event.
    rows = (f"(?1, ?{3 * i + 2}, ?{3 * i + 3}, ?{3 * i + 4})" for i in range(count))
    return "INSERT INTO roder_events (thread_id, sequence, recorded_at_ms, event) VALUES " + (
        ", ".join(rows)
    )


_INSERTS = [""] + [_insert_sql(count) for count in range(1, _INSERT_CHUNK + 1)]
"""``_INSERTS[n]``: the statement inserting ``n`` event rows."""


class SqliteThreadStore(RelationalThreadStore):
    """A thread store in one SQLite file: a ``roder_threads`` row per thread (its metadata,
    folded on every append) and a ``roder_events`` row per journal event.

    Writers in this process share one connection, and concurrent appends share one
    transaction and one sync (each still committed before it returns). Several processes
    may open the same file: ``BEGIN IMMEDIATE`` and the busy timeout order their writes.
    ``read_only`` opens the file with ``mode=ro``: reads work (also on a read-only file or
    directory) and writes raise ``StoreError``.
    """

    store_name = "SQLite thread store"
    joined_events_sql = _JOINED_EVENTS
    keeps_rows = True

    def __init__(
        self,
        path: Path,
        *,
        durability: str = "fsync",
        busy_timeout_s: float = 30.0,
        read_only: bool = False,
    ) -> None:
        _check_durability(durability)
        self.path = path
        self.durability = durability
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self._immutable = False
        self._write_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._writer: sqlite3.Connection | None = None
        self._leases: FileLeases | None = None

    # --- the dialect ----------------------------------------------------------------------

    def translate_error(self, exc: Exception) -> Exception | None:
        """Return a ``StoreError`` for a ``sqlite3.Error``."""
        if isinstance(exc, sqlite3.Error):
            return StoreError(f"SQLite thread store {self.path}: {exc}")
        return None

    def changes_version(self, conn: sqlite3.Connection) -> int:
        """Return ``PRAGMA data_version``: it changes when another connection (this process
        or another) has committed, never for this connection's own commits. Read inside
        ``BEGIN IMMEDIATE``, it is the newest: no other writer can commit meanwhile."""
        return int(conn.execute("PRAGMA data_version").fetchone()[0])

    def insert_events(
        self, conn: sqlite3.Connection, thread_id: str, rows: Sequence[EventRow]
    ) -> None:
        """Insert a thread's new event rows with multi-row ``INSERT`` statements (up to
        ``_INSERT_CHUNK`` rows each: one statement step instead of one a row)."""
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            params: list[object] = [thread_id]
            for row in chunk:
                params += row
            conn.execute(_INSERTS[len(chunk)], params)

    def connect(self) -> sqlite3.Connection:
        """Return a new connection to the file (read-only ones with ``mode=ro``)."""
        if self.read_only:
            mode = "ro&immutable=1" if self._immutable else "ro"
            target, uri = f"file:{quote(str(self.path))}?mode={mode}", True
        else:
            target, uri = str(self.path), False
        # isolation_level=None: we issue BEGIN / COMMIT ourselves (BEGIN IMMEDIATE for writes).
        conn = sqlite3.connect(
            target,
            timeout=self.busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
            uri=uri,
            # Room for the 64 multi-row INSERTs beside the other statements (default 128).
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA synchronous = {DURABILITY_MODES[self.durability]}")
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def warm(self) -> None:
        """Open the first reader connection now, so the first read does not pay for it.

        A read-only store on a directory it cannot write (no WAL index can be made there)
        falls back to reading the file as immutable.
        """
        try:
            conn = self.connect()
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:
            if not self.read_only or self._immutable:
                raise
            self._immutable = True
            conn = self.connect()
        with self._pool_lock:
            self._readers.append(conn)

    @contextmanager
    def read_transaction(self) -> Iterator[sqlite3.Connection]:
        """Yield a pooled connection inside a deferred (snapshot) transaction."""
        with self._pool_lock:
            self.check_open()
            conn = self._readers.pop() if self._readers else None
        if conn is None:
            conn = self.connect()
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

    @contextmanager
    def write_transaction(self) -> Iterator[sqlite3.Connection]:
        """Yield the writer connection inside ``BEGIN IMMEDIATE``; commit on exit."""
        if self.read_only:
            raise StoreError(
                f"the SQLite thread store {self.path} was opened read-only; open it without "
                "read_only to write"
            )
        with self._write_lock:
            self.check_open()
            if self._writer is None:
                self._writer = self.connect()
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return the thread's lease: a ``flock`` on ``<file>.leases/<thread id>.lease``.

        Held across processes; the kernel releases it when the holder dies.
        """
        validate_thread_id(thread_id)
        if self.read_only:
            raise StoreError(
                f"the SQLite thread store {self.path} was opened read-only: it cannot take "
                f"the lease of thread {thread_id!r} (a lease is for running sessions)"
            )
        leases = self.file_leases()
        assert leases is not None
        return leases.lease(thread_id, owner=owner)

    def file_leases(self) -> FileLeases | None:
        """Return the store's file leases (None when opened read-only: its lease refuses)."""
        if self.read_only:
            return None
        if self._leases is None:
            self._leases = FileLeases(leases_directory(self.path), limiter=self.limiter)
        return self._leases

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
        version = _check_version(conn, path)
        for index in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
            if index + 1 == OPEN_TURNS_VERSION:
                backfill_open_turns(conn)
            # PRAGMA takes no parameters; the value is our own integer.
            conn.execute(f"PRAGMA user_version = {index + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _check_version(conn: sqlite3.Connection, path: Path) -> int:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has SQLite store schema version {version}, written by a newer Roder "
            f"(this one knows up to {SCHEMA_VERSION}); upgrade roder-sqlite-thread-store"
        )
    return version


class SqliteThreadStoreFactory(ThreadStoreFactory):
    """Opens SQLite thread stores in the file ``path`` (created with its schema on first use).

    ``durability``: ``fsync`` (default), ``group`` (the same here), ``normal`` or ``none``
    (see :data:`DURABILITY_MODES`); ``busy_timeout_s``: how long a write waits for another
    process's write. ``must_exist``: refuse (``StoreError``, nothing created) when the file
    does not exist. ``read_only``: open an existing store for reading only — nothing is
    created, migrated or written, and it works on read-only files and directories (it
    implies ``must_exist``).
    """

    id = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        busy_timeout_s: float = 30.0,
        read_only: bool = False,
        must_exist: bool = False,
    ) -> None:
        _check_durability(durability)
        self.path = Path(path).expanduser()
        self.durability = durability
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self.must_exist = must_exist or read_only

    def _prepare(self, store: SqliteThreadStore) -> None:
        if self.must_exist and not self.path.is_file():
            raise StoreError(
                f"there is no SQLite thread store at {self.path} (no such file); check the "
                "path — nothing was created"
            )
        if self.read_only:
            store.warm()
            with store.read_transaction() as conn:
                # An older schema is read as it is (nothing migrated): no open_turns column
                # then, so threads_with_pending_input pages through the journals.
                store.open_turns_column = _check_version(conn, self.path) >= OPEN_TURNS_VERSION
                tables = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'roder_threads'"
                ).fetchone()[0]
            if not tables:
                raise StoreError(f"{self.path} is not a Roder SQLite thread store")
            return
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
        store.warm()

    async def open(self) -> SqliteThreadStore:
        """Return a store on ``path``, creating the file and migrating its schema."""
        store = SqliteThreadStore(
            self.path,
            durability=self.durability,
            busy_timeout_s=self.busy_timeout_s,
            read_only=self.read_only,
        )
        try:
            async with store.limiter:
                await run_in_worker(self._prepare, store)
        except (OSError, sqlite3.Error) as exc:
            store.close_sync()
            raise StoreError(f"cannot use {self.path} for the SQLite thread store: {exc}") from exc
        except BaseException:
            store.close_sync()
            raise
        return store

    def describe(self) -> str:
        """Return where the database file is."""
        mode = ", read-only" if self.read_only else ""
        return f"sqlite at {self.path} (durability {self.durability}{mode})"
