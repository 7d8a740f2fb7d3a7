"""The PostgreSQL thread store: threads shared by many workers on many machines.

The store is ``roder_api.storekit``'s relational store in the PostgreSQL dialect: a write
transaction locks the rows of the threads it appends to (``SELECT ... FOR UPDATE``), so
writers anywhere are ordered by the database, and one that loses a race is run again
whole; reads run in ``REPEATABLE READ`` snapshots; leases are session advisory locks
(:mod:`roder_postgres_thread_store._leases`). Blocking calls run in worker threads with
connections from a ``psycopg_pool.ConnectionPool``, so the store works under asyncio and
trio alike.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import anyio
import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from roder_api.errors import StoreError
from roder_api.storekit import (
    OPEN_TURNS_DDL,
    EventRow,
    RelationalThreadStore,
    backfill_open_turns,
    close_on_fork,
    poll_for_events,
    run_in_worker,
)
from roder_api.threads import ThreadLease, ThreadStoreFactory, validate_thread_id
from roder_postgres_thread_store._leases import LEASE_SESSION_OPTIONS, AdvisoryLeases
from roder_postgres_thread_store._notify import RECHECK_S, EventNotifier, channel_name

DSN_ENV = "RODER_POSTGRES_DSN"
"""Environment variable read for the DSN when the settings give none."""

SCHEMA_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}", re.ASCII)
"""What a ``schema`` setting must match (a plain, unquoted PostgreSQL identifier)."""

SCHEMA_VERSION = 3
"""The schema version this code writes (kept in the ``roder_schema_version`` table)."""

OPEN_TURNS_VERSION = 3
"""The schema version that added the ``open_turns`` column (filled once when migrated)."""

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
    (
        # Who holds a thread's lease (the lock itself is an advisory lock, not this row).
        """
        CREATE TABLE roder_leases (
            thread_id text COLLATE "C" PRIMARY KEY,
            owner text NOT NULL,
            pid bigint NOT NULL,
            host text NOT NULL,
            since_ms bigint NOT NULL
        )
        """,
    ),
    # The count of each thread's open turns, indexed where above zero: the store query of
    # threads_with_pending_input. migrate_schema fills it for the threads already stored.
    OPEN_TURNS_DDL,
)

# Transient conflicts after which a whole write transaction is simply run again: nothing of
# it was committed, so a retry can neither duplicate nor lose a batch.
_RETRYABLE = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.UniqueViolation,
)


class PostgresThreadStore(RelationalThreadStore):
    """A thread store in PostgreSQL: a ``roder_threads`` row per thread (metadata folded on
    every append) and a ``roder_events`` row per journal event, in one schema.

    ``connect_lease`` opens the dedicated autocommit connection a lease holds. With
    ``read_only`` every session is read-only (``default_transaction_read_only``) and
    writes raise ``StoreError``.
    """

    store_name = "PostgreSQL thread store"
    placeholder = "%s"
    row_lock = " FOR UPDATE"
    no_limit = None
    size_function = "octet_length"
    max_write_attempts = 8

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        schema: str,
        description: str,
        connect_lease: Callable[[], psycopg.Connection[Any]] | None = None,
        read_only: bool = False,
    ) -> None:
        self._pool = pool
        self.schema = schema
        self.read_only = read_only
        self._description = description
        self._connect_lease = connect_lease
        self._leases: AdvisoryLeases | None = None
        self._channel = channel_name(schema)
        self._notifier: EventNotifier | None = None

    def translate_error(self, exc: Exception) -> Exception | None:
        """Return a ``StoreError`` for a driver or pool error."""
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            return StoreError(
                f"the PostgreSQL thread store ({self._description}) was opened read-only; "
                "open it without read_only to write"
            )
        if isinstance(exc, (psycopg.Error, PoolTimeout)):
            return StoreError(f"PostgreSQL thread store ({self._description}): {exc}")
        return None

    def is_retryable(self, exc: Exception) -> bool:
        """Return True for serialisation failures, deadlocks and lost insert races."""
        return isinstance(exc, _RETRYABLE)

    def encode_payload(self, payload: bytes) -> str:
        """Return the codec's bytes as text (the columns are ``text``: jsonb refuses NUL)."""
        return payload.decode()

    def insert_events(
        self, conn: psycopg.Connection[Any], thread_id: str, rows: Sequence[EventRow]
    ) -> None:
        """Insert a thread's new events in one statement (arrays, not one INSERT each), and
        notify the listeners of the schema's channel (delivered when the transaction
        commits: ``wait_for_events``)."""
        conn.execute("SELECT pg_notify(%s, %s)", (self._channel, thread_id))
        conn.execute(
            "INSERT INTO roder_events (thread_id, sequence, recorded_at_ms, event)"
            " SELECT %s, s, t, e"
            " FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS u(s, t, e)",
            (
                thread_id,
                [row[0] for row in rows],
                [row[1] for row in rows],
                [row[2] for row in rows],
            ),
        )

    @contextmanager
    def write_transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """Yield a pooled connection inside a transaction; commit on exit."""
        self.check_open()
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def read_transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """Yield a pooled connection inside a REPEATABLE READ (snapshot) transaction."""
        self.check_open()
        with self._pool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    yield conn
            finally:
                conn.isolation_level = None

    def fence(self, conn: psycopg.Connection[Any], thread_id: str) -> None:
        """Refuse (``LeaseLostError``) an append of a thread whose lease this store held and
        lost; checked in the append's own transaction (see ``AdvisoryLeases.fence``)."""
        if self._leases is not None:
            self._leases.fence(conn, thread_id)

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return the thread's lease: an advisory lock held by a connection of its own.

        Held across processes and machines; released by the database when the holder's
        session ends (within ~15 s when its machine vanishes).
        """
        validate_thread_id(thread_id)
        self.check_open()
        if self.read_only:
            raise StoreError(
                f"the PostgreSQL thread store ({self._description}) was opened read-only: it "
                f"cannot take the lease of thread {thread_id!r} (a lease is for running sessions)"
            )
        if self._connect_lease is None:
            return super().lease(thread_id, owner=owner)
        if self._leases is None:
            self._leases = AdvisoryLeases(
                self._connect_lease, schema=self.schema, limiter=self.limiter
            )
        return self._leases.lease(thread_id, owner=owner)

    async def wait_for_events(self, thread_id: str, after_sequence: int, timeout_s: float) -> int:
        """Return the thread's last sequence once it is above ``after_sequence`` (woken by
        ``LISTEN/NOTIFY`` from any process or machine), or after ``timeout_s``."""
        if self._connect_lease is None:
            return await super().wait_for_events(thread_id, after_sequence, timeout_s)
        notifier = self._notifier
        if notifier is None:
            notifier = self._notifier = EventNotifier(self._connect_lease, self._channel)
            notifier.start()

        def watch(thread_id: str, event: anyio.Event) -> Callable[[], None]:
            notifier.add(thread_id, event)
            return functools.partial(notifier.discard, thread_id, event)

        # The kit's wait (woken at once by this process's appends), also woken by a
        # notification from any process; the metadata is only reread every RECHECK_S.
        return await poll_for_events(
            self,
            thread_id,
            after_sequence,
            timeout_s,
            watch=watch,
            pauses=(RECHECK_S, RECHECK_S),
            read=self.read_last_sequence,
        )

    def close_sync(self) -> None:
        """Stop listening and close the connection pool (waiting for the calls in progress)."""
        if self._notifier is not None:
            self._notifier.close()
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
            if index + 1 == OPEN_TURNS_VERSION:
                backfill_open_turns(
                    conn, sql=lambda text: text.replace("?", "%s"), encode_payload=bytes.decode
                )
            conn.execute("INSERT INTO roder_schema_version (version) VALUES (%s)", (index + 1,))
    return found


def check_schema(conn: psycopg.Connection[Any], schema: str) -> int:
    """Return the version of the Roder store in ``schema``; ``StoreError`` if there is none.

    Creates and changes nothing (what a read-only or must-exist open needs).
    """
    with conn.transaction():
        table = conn.execute(
            "SELECT to_regclass(%s), to_regclass(%s)",
            (f"{schema}.roder_schema_version", f"{schema}.roder_threads"),
        ).fetchone()
        if table is None or table[0] is None or table[1] is None:
            raise StoreError(
                f"there is no Roder thread store in PostgreSQL schema {schema!r}; check the "
                "schema name — nothing was created"
            )
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}.roder_schema_version").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    found = int(row[0]) if row is not None else 0
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"schema {schema!r} has PostgreSQL store schema version {found}, written by a "
            f"newer Roder (this one knows up to {SCHEMA_VERSION}); upgrade "
            "roder-postgres-thread-store"
        )
    return found


def _guard_connection(conn: psycopg.Connection[Any]) -> None:
    """Keep a pooled connection's socket from forked children (``close_on_fork``).

    A holder SIGKILLed in the middle of a write transaction leaves its row locks to its
    session, which lives as long as any process holds the socket: a background job the
    holder forked would block every writer of those threads until it exits.
    """
    close_on_fork(conn.fileno())


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
    connection pool of each open store. ``must_exist``: refuse (``StoreError``, nothing
    created) unless the schema holds a Roder store. ``read_only``: every session is
    read-only and nothing is created or migrated (it implies ``must_exist``).
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
        read_only: bool = False,
        must_exist: bool = False,
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
        self.read_only = read_only
        self.must_exist = must_exist or read_only

    def resolved_dsn(self) -> str:
        """Return the DSN in use: the configured one, else ``RODER_POSTGRES_DSN``."""
        dsn = self.dsn or os.environ.get(DSN_ENV)
        if not dsn:
            raise StoreError(
                "the PostgreSQL thread store has no DSN: set `dsn = ...` in [thread_store] "
                f"or the {DSN_ENV} environment variable"
            )
        return dsn

    def _session_options(self) -> str:
        # The schema name is checked against SCHEMA_PATTERN, so it needs no quoting.
        options = f"-c search_path={self.schema}"
        if self.read_only:
            options += " -c default_transaction_read_only=on"
        return options

    def _open_sync(self, dsn: str) -> tuple[ConnectionPool, int]:
        """Return the pool and the schema version it reads (older only when read-only)."""
        timeout = max(1, int(self.connect_timeout_s))
        with psycopg.connect(dsn, connect_timeout=timeout) as conn:
            version = SCHEMA_VERSION
            if self.must_exist:
                version = check_schema(conn, self.schema)
            if not self.must_exist or (not self.read_only and version < SCHEMA_VERSION):
                # A store that writes needs the current schema (must_exist only refuses to
                # create one); a read-only open reads an older one as it is.
                migrate_schema(conn, self.schema)
                version = SCHEMA_VERSION
        pool: ConnectionPool = ConnectionPool(
            dsn,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs={"options": self._session_options(), "connect_timeout": timeout},
            timeout=self.connect_timeout_s * 3,
            name=f"roder-{self.schema}",
            configure=_guard_connection,
            open=False,
        )
        try:
            pool.open(wait=True, timeout=self.connect_timeout_s)
        except BaseException:
            pool.close()
            raise
        return pool, version

    def _lease_connector(self, dsn: str) -> Callable[[], psycopg.Connection[Any]]:
        timeout = max(1, int(self.connect_timeout_s))
        options = f"-c search_path={self.schema} {LEASE_SESSION_OPTIONS}"

        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=timeout, options=options)

        return connect

    async def open(self) -> PostgresThreadStore:
        """Return a store with its own connection pool, creating or migrating the schema.

        With ``must_exist`` (or ``read_only``) a schema that is not a Roder store is an
        error and nothing is created.
        """
        dsn = self.resolved_dsn()
        where = f"{_redact(dsn)} schema {self.schema}"
        try:
            pool, version = await run_in_worker(self._open_sync, dsn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(
                f"cannot open the PostgreSQL thread store at {where}: {exc}. Check that the "
                "server is running and the DSN is right"
            ) from exc
        store = PostgresThreadStore(
            pool,
            schema=self.schema,
            description=where,
            connect_lease=self._lease_connector(dsn),
            read_only=self.read_only,
        )
        # A read-only open of an older schema has no open_turns column: it pages instead.
        store.open_turns_column = version >= OPEN_TURNS_VERSION
        return store

    def describe(self) -> str:
        """Return where the threads are stored (without the password)."""
        dsn = self.dsn or os.environ.get(DSN_ENV)
        mode = " (read-only)" if self.read_only else ""
        return f"postgres at {_redact(dsn) if dsn else '(no DSN)'} schema {self.schema}{mode}"
