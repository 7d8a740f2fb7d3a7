"""Which stores the torture trials run against, and how a process opens one."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field
from typing import Any

from roder_api.extension import ExtensionRegistryBuilder
from roder_api.threads import ThreadStoreFactory


@dataclass(frozen=True)
class StoreSpec:
    """A store to torture: a name for the table, a backend id and its settings table."""

    name: str
    backend: str
    settings: dict[str, Any] = field(default_factory=dict)

    def factory(self) -> ThreadStoreFactory:
        """Return a fresh factory for this store, loaded through its entry point.

        Going through the registry (not the plugin's classes) is what a user's runtime does,
        and keeps the torture suite independent of each plugin's module layout.
        """
        builder = ExtensionRegistryBuilder(settings={self.backend: self.settings})
        infos = builder.load_entry_points(names=[self.backend])
        for info in infos:
            if info.error:
                raise RuntimeError(f"store plugin {info.name!r} failed to load: {info.error}")
        return builder.build().thread_store_factory(self.backend)


def installed_backends() -> set[str]:
    """Return the names of the installed ``roder`` entry points."""
    return {ep.name for ep in importlib.metadata.entry_points(group="roder")}


def jsonl_specs(base: str) -> list[StoreSpec]:
    """Return the JSONL store in each durability mode, each in its own directory."""
    return [
        StoreSpec(f"jsonl-{mode}", "jsonl", {"path": os.path.join(base, mode), "durability": mode})
        for mode in ("fsync", "group", "none")
    ]


DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"
"""The test server the PostgreSQL store's own tests use (``RODER_TEST_POSTGRES_DSN``)."""


def postgres_dsn() -> str | None:
    """Return the DSN of a reachable PostgreSQL server to torture, or None."""
    dsn = (
        os.environ.get("RODER_POSTGRES_DSN")
        or os.environ.get("RODER_TEST_POSTGRES_DSN")
        or DEFAULT_TEST_DSN
    )
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return None
    return dsn


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a torture run's PostgreSQL schema."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
