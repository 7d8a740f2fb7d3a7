"""Open turns in the PostgreSQL store: the indexed column the pending-input query reads,
and a store of schema version 2 (no column) migrated once when opened — also with
``must_exist`` — or read as it is, unchanged, when opened read-only (the kit's
``OpenTurnsUpgradeChecks``)."""

from __future__ import annotations

from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

from roder_api.testing.conformance import OpenTurnsUpgradeChecks
from roder_api.threads import ThreadStoreFactory
from roder_postgres_thread_store import SCHEMA_VERSION, PostgresThreadStoreFactory


def _connect(factory: ThreadStoreFactory) -> psycopg.Connection[Any]:
    assert isinstance(factory, PostgresThreadStoreFactory)
    return psycopg.connect(factory.dsn, autocommit=True, options=f"-c search_path={factory.schema}")


class TestPostgresOpenTurns(OpenTurnsUpgradeChecks):
    """The kit's open-turn checks on a PostgreSQL schema, version 2 -> 3."""

    older_version: ClassVar[int] = 2
    current_version: ClassVar[int] = SCHEMA_VERSION

    @pytest.fixture
    def thread_store_factory(self, postgres_dsn: str, schema: str) -> PostgresThreadStoreFactory:
        """Return a factory of a fresh schema."""
        return PostgresThreadStoreFactory(postgres_dsn, schema=schema, max_size=2)

    def read_only_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory:
        """Return a read-only factory of the same schema."""
        assert isinstance(factory, PostgresThreadStoreFactory)
        return PostgresThreadStoreFactory(factory.dsn, schema=factory.schema, read_only=True)

    def as_older_version(self, factory: ThreadStoreFactory) -> None:
        """Turn the store back into what schema version 2 wrote: no column, no field."""
        with _connect(factory) as conn, conn.transaction():
            conn.execute("DROP INDEX roder_threads_open")
            conn.execute("ALTER TABLE roder_threads DROP COLUMN open_turns")
            for thread_id, raw in conn.execute("SELECT thread_id, metadata FROM roder_threads"):
                conn.execute(
                    "UPDATE roder_threads SET metadata = %s WHERE thread_id = %s",
                    (self.older_metadata(raw), thread_id),
                )
            conn.execute("DELETE FROM roder_schema_version WHERE version = 3")

    def stored_version(self, factory: ThreadStoreFactory) -> int:
        """Return the schema's newest recorded version."""
        with _connect(factory) as conn:
            row = conn.execute("SELECT max(version) FROM roder_schema_version").fetchone()
        assert row is not None
        return int(row[0])

    def stored_open_turns(self, factory: ThreadStoreFactory) -> dict[str, int] | None:
        """Return the open_turns column's values (None: no such column)."""
        assert isinstance(factory, PostgresThreadStoreFactory)
        with _connect(factory) as conn:
            column = conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'roder_threads' AND column_name = 'open_turns'",
                (factory.schema,),
            ).fetchone()
            if column is None:
                return None
            return dict(conn.execute("SELECT thread_id, open_turns FROM roder_threads"))

    def stored_state(self, factory: ThreadStoreFactory) -> object:
        """Return the version, the counts and every thread's stored metadata."""
        with _connect(factory) as conn:
            metadata = [r[0] for r in conn.execute("SELECT metadata FROM roder_threads ORDER BY 1")]
        return self.stored_version(factory), self.stored_open_turns(factory), metadata

    async def check_older_reader(self, reader: Any, threads: dict[str, str]) -> None:
        """No column to query: it pages through the journals."""
        assert not reader.open_turns_column

    async def test_an_older_store_is_upgraded_once_with_must_exist(
        self, thread_store_factory: PostgresThreadStoreFactory
    ) -> None:
        factory = PostgresThreadStoreFactory(
            thread_store_factory.dsn,
            schema=thread_store_factory.schema,
            max_size=2,
            must_exist=True,
        )
        await (await thread_store_factory.open()).aclose()  # the schema, empty
        await self.test_an_older_store_is_upgraded_once_when_opened(factory)

    async def test_the_pending_query_uses_the_partial_index(
        self, thread_store_factory: PostgresThreadStoreFactory
    ) -> None:
        await self.store_open_turn_threads(thread_store_factory)
        with _connect(thread_store_factory) as conn:
            # A two-row table: with statistics and no scan of the whole table allowed, the
            # planner shows the partial index serves the query.
            conn.execute("ANALYZE roder_threads")
            conn.execute("SET enable_seqscan = off")
            plan = "\n".join(
                str(row[0])
                for row in conn.execute(
                    sql.SQL(
                        "EXPLAIN SELECT thread_id FROM roder_threads WHERE open_turns > 0 AND "
                        "updated_at_ms >= 0 ORDER BY updated_at_ms DESC, thread_id DESC LIMIT 100"
                    )
                )
            )
        assert "roder_threads_open" in plan, plan
