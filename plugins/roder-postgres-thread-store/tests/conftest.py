"""The PostgreSQL server for these tests: skip cleanly when it is unreachable."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under trio."""
    return str(request.param)


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """Return the test server's DSN (``RODER_TEST_POSTGRES_DSN``), or skip if it is down."""
    dsn = os.environ.get("RODER_TEST_POSTGRES_DSN") or DEFAULT_TEST_DSN
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable: {str(exc).strip().splitlines()[0]}")
    return dsn


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[str]:
    """Return a fresh schema name for this test; drop the schema afterwards."""
    name = f"roder_test_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
