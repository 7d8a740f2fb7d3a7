"""The PostgreSQL thread store: threads shared by many workers on many machines."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import anyio.to_thread
import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from roder_api.codec import dumps, from_dict, loads_json
from roder_api.errors import (
    SequenceConflictError,
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

DSN_ENV = "RODER_POSTGRES_DSN"
"""Environment variable read for the DSN when the settings give none."""

SCHEMA_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}", re.ASCII)
"""What a ``schema`` setting must match (a plain, unquoted PostgreSQL identifier)."""

SCHEMA_VERSION = 1
"""The schema version this code writes (kept in the ``roder_schema_version`` table)."""

# Each entry migrates the schema from version ``index`` to ``index + 1``; never edit a
# released entry, append a new one. Thread ids sort with COLLATE "C" (byte order) so that
# listings and cursors agree with Python's string order, whatever the database's locale.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE roder_threads (
            thread_id text COLLATE "C" PRIMARY KEY,
            updated_at_ms bigint NOT NULL,
            last_sequence bigint NOT NULL,
            boundary_sequence bigint NOT NULL,
            metadata text NOT NULL
        )
        """,
        "CREATE INDEX roder_threads_by_update ON roder_threads (updated_at_ms, thread_id)",
        """
        CREATE TABLE roder_events (
            thread_id text COLLATE "C" NOT NULL,
            sequence bigint NOT NULL,
            recorded_at_ms bigint NOT NULL,
            event text NOT NULL,
            PRIMARY KEY (thread_id, sequence)
        )
        """,
    ),
)

# Transient conflicts after which a whole write transaction is simply run again: nothing of
# it was committed, so a retry can neither duplicate nor lose a batch.
_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.UniqueViolation,
)
_MAX_ATTEMPTS = 8


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metadata(raw: str) -> ThreadMetadata:
    metadata: ThreadMetadata = from_dict(loads_json(raw))
    return metadata


class _Append:
    """One batch waiting for a group commit, and its outcome."""

    __slots__ = ("events", "payloads", "expected", "done", "entries", "error")

    def __init__(
        self, events: Sequence[Event], payloads: Sequence[str], expected: int | None
    ) -> None:
        self.events = events
        self.payloads = payloads
        self.expected = expected
        self.done = False
        self.entries: list[JournalEvent] = []
        self.error: BaseException | None = None


class PostgresThreadStore(BlockingThreadStore):
    """A thread store in PostgreSQL: a ``roder_threads`` row per thread (metadata folded on
    every append) and a ``roder_events`` row per journal event, in one schema.

    Each append locks its thread's row (``SELECT ... FOR UPDATE``), so writers anywhere are
    ordered by the database; the ``(thread_id, sequence)`` primary key backs that up, and a
    transaction that loses a race is run again whole. Concurrent appends to one thread from
    this process share one transaction (group commit). Blocking database calls run in worker
    threads with connections from a ``psycopg_pool.ConnectionPool``, so the store works
    under asyncio and trio alike.
    """

    def __init__(self, pool: ConnectionPool, *, schema: str, description: str) -> None:
        self._pool = pool
        self.schema = schema
        self._description = description
        self._pending_lock = threading.Lock()
        self._pending: dict[str, list[_Append]] = {}
        # Striped: a lock per thread id would grow without bound.
        self._append_locks = tuple(threading.Lock() for _ in range(64))

    store_name = "PostgreSQL thread store"

    def translate_error(self, exc: Exception) -> Exception | None:
        """Return a ``StoreError`` for a driver or pool error."""
        if isinstance(exc, (psycopg.Error, PoolTimeout)):
            return StoreError(f"PostgreSQL thread store ({self._description}): {exc}")
        return None

    def _write(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` in a transaction, again from the start after a transient conflict.

        (Pipeline mode was measured slower here than four plain round trips.)
        """
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self._pool.connection() as conn, conn.transaction():
                    return work(conn)
            except _RETRYABLE:
                if attempt == _MAX_ATTEMPTS:
                    raise
                time.sleep(0.005 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _row(conn: psycopg.Connection[Any], thread_id: str, *, lock: bool) -> tuple[int, int, str]:
        query = (
            "SELECT last_sequence, boundary_sequence, metadata FROM roder_threads "
            "WHERE thread_id = %s"
        )
        row = conn.execute(query + (" FOR UPDATE" if lock else ""), (thread_id,)).fetchone()
        if row is None:
            raise ThreadNotFoundError(thread_id)
        return int(row[0]), int(row[1]), str(row[2])

    @staticmethod
    def _store_metadata(
        conn: psycopg.Connection[Any], metadata: ThreadMetadata, boundary_sequence: int
    ) -> None:
        conn.execute(
            "UPDATE roder_threads SET updated_at_ms = %s, last_sequence = %s, "
            "boundary_sequence = %s, metadata = %s WHERE thread_id = %s",
            (
                metadata.updated_at_ms,
                metadata.last_sequence,
                boundary_sequence,
                dumps(metadata).decode(),
                metadata.thread_id,
            ),
        )

    def _insert(
        self,
        conn: psycopg.Connection[Any],
        thread_id: str,
        entries: Sequence[JournalEvent],
        payloads: Sequence[str],
        boundary: int,
        raw_metadata: str,
    ) -> None:
        folded = fold_metadata(_metadata(raw_metadata), entries)
        # One statement for the events and the thread's row (arrays, not one INSERT each).
        conn.execute(
            "WITH inserted AS ("
            " INSERT INTO roder_events (thread_id, sequence, recorded_at_ms, event)"
            " SELECT %(thread_id)s, s, t, e"
            " FROM unnest(%(sequences)s::bigint[], %(times)s::bigint[], %(events)s::text[])"
            " AS u(s, t, e))"
            " UPDATE roder_threads SET updated_at_ms = %(updated)s, last_sequence = %(last)s,"
            " boundary_sequence = %(boundary)s, metadata = %(metadata)s"
            " WHERE thread_id = %(thread_id)s",
            {
                "thread_id": thread_id,
                "sequences": [entry.sequence for entry in entries],
                "times": [entry.recorded_at_ms for entry in entries],
                "events": list(payloads),
                "updated": folded.updated_at_ms,
                "last": folded.last_sequence,
                "boundary": last_boundary_sequence(entries, boundary),
                "metadata": dumps(folded).decode(),
            },
        )

    # --- blocking work --------------------------------------------------------------------

    def create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0)

        def work(conn: psycopg.Connection[Any]) -> None:
            inserted = conn.execute(
                "INSERT INTO roder_threads (thread_id, updated_at_ms, last_sequence, "
                "boundary_sequence, metadata) VALUES (%s, %s, 0, 0, %s) "
                "ON CONFLICT (thread_id) DO NOTHING RETURNING thread_id",
                (stored.thread_id, stored.updated_at_ms, dumps(stored).decode()),
            ).fetchone()
            if inserted is None:
                raise ThreadExistsError(stored.thread_id)

        self._write(work)
        return stored

    def append_sync(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Append one batch, committed together with this process's other pending batches
        for the same thread (group commit: one row lock and one commit for all of them).
        """
        # psycopg sends the events as text (jsonb input).
        request = _Append(
            events, [payload.decode() for payload in payloads], expected_last_sequence
        )
        with self._pending_lock:
            self._pending.setdefault(thread_id, []).append(request)
        with self._append_locks[hash(thread_id) % len(self._append_locks)]:
            if not request.done:
                with self._pending_lock:
                    group = self._pending.pop(thread_id, [])
                self._append_group(thread_id, group)
        if request.error is not None:
            raise request.error
        return request.entries

    def _append_group(self, thread_id: str, group: list[_Append]) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            # The row lock (FOR UPDATE) is held to COMMIT: nobody appends between the
            # conditional checks below and the insert.
            last, boundary, raw = self._row(conn, thread_id, lock=True)
            now = _now_ms()
            entries: list[JournalEvent] = []
            payloads: list[str] = []
            for request in group:
                request.entries, request.error = [], None
                try:
                    check_expected(thread_id, request.expected, last + len(entries))
                except SequenceConflictError as exc:
                    request.error = exc  # this batch alone is refused
                    continue
                first = last + 1 + len(entries)
                request.entries = [
                    JournalEvent(first + i, now, e) for i, e in enumerate(request.events)
                ]
                entries.extend(request.entries)
                payloads.extend(request.payloads)
            if entries:
                self._insert(conn, thread_id, entries, payloads, boundary, raw)

        try:
            self._write(work)
        except BaseException as exc:
            # Nothing of the group was committed: every batch in it gets the error.
            for request in group:
                request.entries, request.error = [], exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for request in group:
                request.done = True

    def import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], encoded: Sequence[bytes]
    ) -> None:
        payloads = [payload.decode() for payload in encoded]

        def work(conn: psycopg.Connection[Any]) -> None:
            last, boundary, raw = self._row(conn, thread_id, lock=True)
            if entries[0].sequence != last + 1:
                raise SequenceConflictError(thread_id, last + 1, entries[0].sequence)
            self._insert(conn, thread_id, entries, payloads, boundary, raw)

        self._write(work)

    def update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        def work(conn: psycopg.Connection[Any]) -> ThreadMetadata:
            _, boundary, raw = self._row(conn, thread_id, lock=True)
            metadata = _metadata(raw)
            updated = max(metadata.updated_at_ms, _now_ms())
            metadata = replace(metadata, updated_at_ms=updated, **changes)
            self._store_metadata(conn, metadata, boundary)
            return metadata

        return self._write(work)

    def delete_sync(self, thread_id: str) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            deleted = conn.execute(
                "DELETE FROM roder_threads WHERE thread_id = %s RETURNING thread_id", (thread_id,)
            ).fetchone()
            if deleted is None:
                raise ThreadNotFoundError(thread_id)
            conn.execute("DELETE FROM roder_events WHERE thread_id = %s", (thread_id,))

        self._write(work)

    def get_sync(self, thread_id: str) -> ThreadMetadata:
        with self._pool.connection() as conn:
            return _metadata(self._row(conn, thread_id, lock=False)[2])

    def read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        # REPEATABLE READ: the thread row and its events come from one snapshot.
        with self._pool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    _, boundary, _ = self._row(conn, thread_id, lock=False)
                    if replay:
                        after = max(after, boundary - 1)
                    rows = conn.execute(
                        "SELECT sequence, recorded_at_ms, event FROM roder_events "
                        "WHERE thread_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
                        (thread_id, after, limit),
                    ).fetchall()
            finally:
                conn.isolation_level = None
        return [JournalEvent(seq, t, from_dict(loads_json(raw))) for seq, t, raw in rows]

    def page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        with self._pool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    last, _, _ = self._row(conn, thread_id, lock=False)
                    if before is None:
                        before = last + 1
                    rows = conn.execute(
                        "SELECT sequence, recorded_at_ms, event FROM roder_events "
                        "WHERE thread_id = %s AND sequence < %s ORDER BY sequence DESC LIMIT %s",
                        (thread_id, before, limit),
                    ).fetchall()
            finally:
                conn.isolation_level = None
        events = tuple(
            JournalEvent(seq, t, from_dict(loads_json(raw))) for seq, t, raw in reversed(rows)
        )
        first = events[0].sequence if events else before
        return EventPage(events, first if first > 1 else None)

    def size_sync(self, thread_id: str) -> int:
        with self._pool.connection() as conn:
            _, _, raw = self._row(conn, thread_id, lock=False)
            row = conn.execute(
                "SELECT coalesce(sum(octet_length(event)), 0) FROM roder_events "
                "WHERE thread_id = %s",
                (thread_id,),
            ).fetchone()
        return len(raw.encode()) + (int(row[0]) if row is not None else 0)

    def list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        with self._pool.connection() as conn:
            if cursor:
                updated, after_id = decode_cursor(cursor)
                rows = conn.execute(
                    "SELECT metadata FROM roder_threads "
                    "WHERE (updated_at_ms, thread_id) < (%s, %s) "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT %s",
                    (updated, after_id, limit + 1),
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT metadata FROM roder_threads "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT %s",
                    (limit + 1,),
                ).fetchall()
        threads = [_metadata(raw) for (raw,) in rows]
        page = threads[:limit]
        more = len(threads) > limit
        return ThreadPage(tuple(page), encode_cursor(*listing_key(page[-1])) if more else None)

    def close_sync(self) -> None:
        """Close the connection pool (waiting for the calls in progress)."""
        self._pool.close()


def migrate_schema(conn: psycopg.Connection[Any], schema: str) -> int:
    """Create or migrate the store's tables in ``schema``; return the version found before.

    Runs in one transaction under an advisory lock, so processes starting together on a new
    database migrate it once.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ("roder-schema:" + schema,))
        # Only DDL that is needed: a schema prepared by an administrator needs no CREATE right.
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if exists.fetchone() is None:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        table = conn.execute("SELECT to_regclass('roder_schema_version')").fetchone()
        if table is None or table[0] is None:
            conn.execute(
                "CREATE TABLE roder_schema_version ("
                "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        row = conn.execute("SELECT coalesce(max(version), 0) FROM roder_schema_version").fetchone()
        found = int(row[0]) if row is not None else 0
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"schema {schema!r} has PostgreSQL store schema version {found}, written by a "
                f"newer Roder (this one knows up to {SCHEMA_VERSION}); upgrade "
                "roder-postgres-thread-store"
            )
        for index in range(found, SCHEMA_VERSION):
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
            conn.execute("INSERT INTO roder_schema_version (version) VALUES (%s)", (index + 1,))
    return found


def _redact(dsn: str) -> str:
    """Return ``dsn`` without its password, for messages."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the configured DSN"
    host = info.get("host", "localhost")
    return f"{info.get('user', '')}@{host}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class PostgresThreadStoreFactory(ThreadStoreFactory):
    """Opens PostgreSQL thread stores.

    ``dsn`` (or ``RODER_POSTGRES_DSN``) says where the server is; ``schema`` holds the
    store's tables (created and migrated on first use); ``min_size`` / ``max_size`` size the
    connection pool of each open store.
    """

    id = "postgres"

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "roder",
        min_size: int = 1,
        max_size: int = 8,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if SCHEMA_PATTERN.fullmatch(schema) is None:
            raise ValueError(
                f"invalid PostgreSQL schema name {schema!r}: use lower-case letters, digits "
                "and '_' (at most 63), not starting with a digit"
            )
        if not 1 <= min_size <= max_size:
            raise ValueError("pool sizes must satisfy 1 <= min_size <= max_size")
        self.dsn = dsn
        self.schema = schema
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout_s = connect_timeout_s

    def resolved_dsn(self) -> str:
        """Return the DSN in use: the configured one, else ``RODER_POSTGRES_DSN``."""
        dsn = self.dsn or os.environ.get(DSN_ENV)
        if not dsn:
            raise StoreError(
                "the PostgreSQL thread store has no DSN: set `dsn = ...` in [thread_store] "
                f"or the {DSN_ENV} environment variable"
            )
        return dsn

    def _open_sync(self, dsn: str) -> ConnectionPool:
        timeout = max(1, int(self.connect_timeout_s))
        with psycopg.connect(dsn, connect_timeout=timeout) as conn:
            migrate_schema(conn, self.schema)
        pool: ConnectionPool = ConnectionPool(
            dsn,
            min_size=self.min_size,
            max_size=self.max_size,
            # The schema name is checked against SCHEMA_PATTERN, so it needs no quoting.
            kwargs={"options": f"-c search_path={self.schema}", "connect_timeout": timeout},
            timeout=self.connect_timeout_s * 3,
            name=f"roder-{self.schema}",
            open=False,
        )
        try:
            pool.open(wait=True, timeout=self.connect_timeout_s)
        except BaseException:
            pool.close()
            raise
        return pool

    async def open(self) -> PostgresThreadStore:
        """Return a store with its own connection pool, creating or migrating the schema."""
        dsn = self.resolved_dsn()
        where = f"{_redact(dsn)} schema {self.schema}"
        try:
            pool = await anyio.to_thread.run_sync(self._open_sync, dsn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(
                f"cannot open the PostgreSQL thread store at {where}: {exc}. Check that the "
                "server is running and the DSN is right"
            ) from exc
        return PostgresThreadStore(pool, schema=self.schema, description=where)

    def describe(self) -> str:
        """Return where the threads are stored (without the password)."""
        dsn = self.dsn or os.environ.get(DSN_ENV)
        return f"postgres at {_redact(dsn) if dsn else '(no DSN)'} schema {self.schema}"
