"""The thread-store conformance kit, run against every store of this repository."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from roder_api.testing import MemoryThreadStoreFactory
from roder_api.testing.conformance import ThreadStoreConformance
from roder_api.threads import ThreadStoreFactory
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from .postgres_support import require_postgres, temporary_schema


@pytest.fixture(
    params=[
        pytest.param("memory", marks=pytest.mark.core),
        pytest.param("jsonl", marks=pytest.mark.core),
        "jsonl-none",
        "jsonl-fsync",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def thread_store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[ThreadStoreFactory]:
    """Return an empty store of each backend: memory, JSONL, SQLite and PostgreSQL.

    JSONL also with its other durabilities: ``none`` commits through the group commit like
    the default ``group``, ``fsync`` one commit at a time.
    """
    if request.param == "memory":
        yield MemoryThreadStoreFactory()
    elif request.param == "jsonl":
        yield JsonlThreadStoreFactory(base_path=tmp_path / "threads")
    elif request.param.startswith("jsonl-"):
        durability = request.param.removeprefix("jsonl-")
        yield JsonlThreadStoreFactory(base_path=tmp_path / "threads", durability=durability)
    elif request.param == "sqlite":
        yield SqliteThreadStoreFactory(tmp_path / "threads.sqlite3")
    else:
        from roder_postgres_thread_store import PostgresThreadStoreFactory

        dsn = require_postgres()
        with temporary_schema() as schema:
            yield PostgresThreadStoreFactory(dsn, schema=schema, max_size=4)


class TestThreadStoreConformance(ThreadStoreConformance):
    """Every store passes the whole kit (the factory fixture above is parametrized)."""

    @pytest.fixture
    def thread_store_factory(  # type: ignore[override]
        self, thread_store_factory: ThreadStoreFactory
    ) -> ThreadStoreFactory:
        """Use the module's parametrized factory."""
        return thread_store_factory

    def read_only_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory | None:
        """Open every store read-only (its ``read_only`` option)."""
        if isinstance(factory, JsonlThreadStoreFactory):
            return JsonlThreadStoreFactory(
                factory.base_path, durability=factory.durability, read_only=True
            )
        if isinstance(factory, SqliteThreadStoreFactory):
            return SqliteThreadStoreFactory(factory.path, read_only=True)
        if type(factory).__name__ == "PostgresThreadStoreFactory":
            from roder_postgres_thread_store import PostgresThreadStoreFactory

            assert isinstance(factory, PostgresThreadStoreFactory)
            return PostgresThreadStoreFactory(
                factory.dsn, schema=factory.schema, max_size=2, read_only=True
            )
        return None

    def damage_event(
        self, factory: ThreadStoreFactory, thread_id: str, sequence: int, kind: str
    ) -> bool:
        """Damage one event as a user or bit rot would: the file's lines, the rows by SQL."""
        if isinstance(factory, JsonlThreadStoreFactory):
            journal = factory.base_path / "threads" / f"{thread_id}.jsonl"
            lines = journal.read_bytes().splitlines(keepends=True)
            if kind == "garbage":  # the text changed, the checksum not: the line fails it
                lines[sequence] = lines[sequence].replace(b'"text":"', b'"text":"X', 1)
            else:
                del lines[sequence]  # line 0 is the create line, line n holds sequence n
            journal.write_bytes(b"".join(lines))
            return True
        if isinstance(factory, SqliteThreadStoreFactory):
            with sqlite3.connect(factory.path) as conn:
                if kind == "garbage":
                    conn.execute(
                        "UPDATE roder_events SET event = 'not json {' "
                        "WHERE thread_id = ? AND sequence = ?",
                        (thread_id, sequence),
                    )
                else:
                    conn.execute(
                        "DELETE FROM roder_events WHERE thread_id = ? AND sequence = ?",
                        (thread_id, sequence),
                    )
            conn.close()
            return True
        if type(factory).__name__ == "PostgresThreadStoreFactory":
            import psycopg
            from psycopg import sql

            from roder_postgres_thread_store import PostgresThreadStoreFactory

            assert isinstance(factory, PostgresThreadStoreFactory)
            table = sql.Identifier(factory.schema, "roder_events")
            with psycopg.connect(factory.resolved_dsn(), autocommit=True) as pg:
                if kind == "garbage":  # the column is text: any text at all
                    pg.execute(
                        sql.SQL(
                            "UPDATE {} SET event = 'not json {{' "
                            "WHERE thread_id = %s AND sequence = %s"
                        ).format(table),
                        (thread_id, sequence),
                    )
                else:
                    pg.execute(
                        sql.SQL("DELETE FROM {} WHERE thread_id = %s AND sequence = %s").format(
                            table
                        ),
                        (thread_id, sequence),
                    )
            return True
        return False
