"""A Roder thread store in PostgreSQL, for many runtime workers on many machines."""

from __future__ import annotations

from roder_postgres_thread_store._store import (
    DSN_ENV,
    SCHEMA_VERSION,
    PostgresThreadStore,
    PostgresThreadStoreFactory,
    check_schema,
    migrate_schema,
)

__all__ = [
    "DSN_ENV",
    "PostgresThreadStore",
    "PostgresThreadStoreFactory",
    "SCHEMA_VERSION",
    "check_schema",
    "migrate_schema",
]
