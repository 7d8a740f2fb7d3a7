"""The PostgreSQL server the tests use: its DSN, whether it is up, and throwaway schemas; a
factory of each real store kind (PostgreSQL in such a schema)."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from roder_api.threads import ThreadStoreFactory

STORE_KINDS = ("jsonl", "sqlite", "postgres")
"""The real stores a test runs on (``store_factory_of``)."""

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"
"""The local server ``scripts/start-services`` starts (trust authentication)."""


def postgres_test_dsn() -> str:
    """Return the DSN of the test server (``RODER_TEST_POSTGRES_DSN`` overrides it)."""
    return os.environ.get("RODER_TEST_POSTGRES_DSN") or DEFAULT_TEST_DSN


@functools.cache
def unreachable_reason() -> str | None:
    """Return why the test server cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(postgres_test_dsn(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        return f"PostgreSQL is not reachable: {str(exc).strip().splitlines()[0]}"
    return None


def require_postgres() -> str:
    """Return the test DSN, or skip the test when the server is not reachable."""
    reason = unreachable_reason()
    if reason is not None:
        pytest.skip(reason)
    return postgres_test_dsn()


@contextmanager
def temporary_schema(prefix: str = "roder_test") -> Iterator[str]:
    """Yield a fresh schema name; drop the schema (if created) afterwards."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(postgres_test_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@contextmanager
def store_factory_of(
    kind: str, tmp_path: Path, schema_prefix: str = "roder_test"
) -> Iterator[ThreadStoreFactory]:
    """Yield a factory of an empty store of ``kind`` (one of ``STORE_KINDS``).

    JSONL and SQLite live in ``tmp_path``; PostgreSQL in a throwaway schema (the test is
    skipped when the server is not reachable).
    """
    if kind == "jsonl":
        from roder_jsonl_thread_store import JsonlThreadStoreFactory

        yield JsonlThreadStoreFactory(base_path=tmp_path / "threads")
    elif kind == "sqlite":
        from roder_sqlite_thread_store import SqliteThreadStoreFactory

        yield SqliteThreadStoreFactory(tmp_path / "threads.sqlite3")
    else:
        dsn = require_postgres()
        from roder_postgres_thread_store import PostgresThreadStoreFactory

        with temporary_schema(schema_prefix) as schema:
            yield PostgresThreadStoreFactory(dsn, schema=schema)
