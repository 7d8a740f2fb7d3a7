"""Open turns in the SQLite store: the indexed column the pending-input query reads, and a
store of schema version 1 (no column) migrated once when opened — or read as it is,
unchanged, when opened read-only (the kit's ``OpenTurnsUpgradeChecks``)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, ClassVar

import pytest

from roder_api.testing.conformance import OpenTurnsUpgradeChecks
from roder_api.threads import ThreadStoreFactory
from roder_sqlite_thread_store import SCHEMA_VERSION, SqliteThreadStoreFactory


def _path(factory: ThreadStoreFactory) -> Path:
    assert isinstance(factory, SqliteThreadStoreFactory)
    return factory.path


class TestSqliteOpenTurns(OpenTurnsUpgradeChecks):
    """The kit's open-turn checks on a SQLite file, schema version 1 -> 2."""

    older_version: ClassVar[int] = 1
    current_version: ClassVar[int] = SCHEMA_VERSION

    @pytest.fixture
    def thread_store_factory(self, tmp_path: Path) -> SqliteThreadStoreFactory:
        """Return a factory of an empty SQLite store."""
        return SqliteThreadStoreFactory(tmp_path / "threads.db")

    def read_only_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory:
        """Return a read-only factory of the same file."""
        return SqliteThreadStoreFactory(_path(factory), read_only=True)

    def as_older_version(self, factory: ThreadStoreFactory) -> None:
        """Turn the store back into what schema version 1 wrote: no column, no field."""
        with closing(sqlite3.connect(_path(factory), isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DROP INDEX roder_threads_open")
            conn.execute("ALTER TABLE roder_threads DROP COLUMN open_turns")
            for thread_id, raw in conn.execute("SELECT thread_id, metadata FROM roder_threads"):
                older = self.older_metadata(raw).encode()
                conn.execute(
                    "UPDATE roder_threads SET metadata = ? WHERE thread_id = ?", (older, thread_id)
                )
            conn.execute("PRAGMA user_version = 1")
            conn.execute("COMMIT")

    def stored_version(self, factory: ThreadStoreFactory) -> int:
        """Return the file's ``user_version``."""
        with closing(sqlite3.connect(_path(factory))) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def stored_open_turns(self, factory: ThreadStoreFactory) -> dict[str, int] | None:
        """Return the open_turns column's values (None: no such column)."""
        with closing(sqlite3.connect(_path(factory))) as conn:
            columns = [row[1] for row in conn.execute("PRAGMA table_info(roder_threads)")]
            if "open_turns" not in columns:
                return None
            return dict(conn.execute("SELECT thread_id, open_turns FROM roder_threads"))

    def stored_state(self, factory: ThreadStoreFactory) -> object:
        """Return the file's bytes."""
        return _path(factory).read_bytes()

    async def check_older_reader(self, reader: Any, threads: dict[str, str]) -> None:
        """No column to query: it pages through the journals; the metadata is not folded."""
        assert not reader.open_turns_column
        assert (await reader.get_thread(threads["pending"])).open_turns == ()

    async def test_the_pending_query_uses_the_partial_index(
        self, thread_store_factory: SqliteThreadStoreFactory
    ) -> None:
        await self.store_open_turn_threads(thread_store_factory)
        with closing(sqlite3.connect(thread_store_factory.path)) as conn:
            plan = " ".join(
                str(row[-1])
                for row in conn.execute(
                    "EXPLAIN QUERY PLAN SELECT thread_id FROM roder_threads WHERE "
                    "open_turns > 0 AND updated_at_ms >= 0 "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT 100"
                )
            )
        assert "roder_threads_open" in plan, plan
