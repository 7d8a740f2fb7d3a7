"""Registers the PostgreSQL thread store (id ``postgres``) through the ``roder`` entry point."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError
from roder_api.storekit import StoreSettings
from roder_api.threads import ThreadStoreFactory
from roder_postgres_thread_store._store import PostgresThreadStoreFactory


@hookimpl
def register_thread_store_factories(
    register: Callable[[ThreadStoreFactory], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register the ``postgres`` factory, configured by the ``postgres`` settings table.

    Keys: ``dsn`` (else ``RODER_POSTGRES_DSN`` when the store opens), ``schema``,
    ``min_size`` / ``max_size`` (the connection pool), ``connect_timeout_s``, and
    ``read_only`` / ``must_exist`` (booleans; see :class:`PostgresThreadStoreFactory`).
    """
    table = StoreSettings(
        "postgres",
        settings.get("postgres"),
        (
            "dsn",
            "schema",
            "min_size",
            "max_size",
            "connect_timeout_s",
            "read_only",
            "must_exist",
        ),
    )
    try:
        factory = PostgresThreadStoreFactory(
            table.string("dsn", None) or None,
            schema=table.string("schema", "roder") or "roder",
            min_size=table.integer("min_size", 1),
            max_size=table.integer("max_size", 8),
            connect_timeout_s=table.seconds("connect_timeout_s", 10.0),
            read_only=table.flag("read_only"),
            must_exist=table.flag("must_exist"),
        )
    except PluginSettingsError:
        raise
    except (TypeError, ValueError) as exc:
        raise PluginSettingsError("postgres", None, f"[thread_store]: {exc}") from None
    register(factory)
