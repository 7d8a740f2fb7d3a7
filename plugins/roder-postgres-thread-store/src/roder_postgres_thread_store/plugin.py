"""Registers the PostgreSQL thread store (id ``postgres``) through the ``roder`` entry point."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError, check_settings
from roder_api.threads import ThreadStoreFactory
from roder_postgres_thread_store._store import PostgresThreadStoreFactory


def _flag(value: object) -> bool:
    """Return a boolean setting given as a bool or as text (``"true"``, ``"1"``, ...)."""
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


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
    table = settings.get("postgres", {})
    check_settings(
        "postgres",
        table,
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
    dsn = table.get("dsn")
    try:
        factory = PostgresThreadStoreFactory(
            str(dsn) if dsn else None,
            schema=str(table.get("schema", "roder")),
            min_size=int(table.get("min_size", 1)),
            max_size=int(table.get("max_size", 8)),
            connect_timeout_s=float(table.get("connect_timeout_s", 10.0)),
            read_only=_flag(table.get("read_only", False)),
            must_exist=_flag(table.get("must_exist", False)),
        )
    except (TypeError, ValueError) as exc:
        raise PluginSettingsError("postgres", None, f"[thread_store]: {exc}") from None
    register(factory)
