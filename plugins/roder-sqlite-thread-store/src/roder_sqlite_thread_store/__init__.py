"""A Roder thread store in one SQLite file (WAL mode), shared by several processes."""

from __future__ import annotations

from roder_sqlite_thread_store._store import (
    DURABILITY_MODES,
    SCHEMA_VERSION,
    SqliteThreadStore,
    SqliteThreadStoreFactory,
)

__all__ = [
    "DURABILITY_MODES",
    "SCHEMA_VERSION",
    "SqliteThreadStore",
    "SqliteThreadStoreFactory",
]
