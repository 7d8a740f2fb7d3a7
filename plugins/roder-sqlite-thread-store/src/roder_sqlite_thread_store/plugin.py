"""Registers the SQLite thread store (id ``sqlite``) through the ``roder`` entry point."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError, check_settings
from roder_api.threads import ThreadStoreFactory
from roder_sqlite_thread_store._store import SqliteThreadStoreFactory


def default_path() -> Path:
    """Return ``$RODER_HOME/threads.sqlite3`` (``RODER_HOME`` defaults to ``~/.roder``)."""
    home = os.environ.get("RODER_HOME") or "~/.roder"
    return Path(home).expanduser() / "threads.sqlite3"


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
    """Register the ``sqlite`` factory, configured by the ``sqlite`` settings table.

    Keys: ``path`` (the database file), ``durability`` (fsync, group, normal, none),
    ``busy_timeout_s``, ``read_only`` and ``must_exist`` (booleans; see
    :class:`SqliteThreadStoreFactory`).
    """
    table = settings.get("sqlite", {})
    check_settings(
        "sqlite", table, ("path", "durability", "busy_timeout_s", "read_only", "must_exist")
    )
    path = table.get("path")
    try:
        factory = SqliteThreadStoreFactory(
            Path(str(path)).expanduser() if path else default_path(),
            durability=str(table.get("durability", "fsync")),
            busy_timeout_s=float(table.get("busy_timeout_s", 30.0)),
            read_only=_flag(table.get("read_only", False)),
            must_exist=_flag(table.get("must_exist", False)),
        )
    except (TypeError, ValueError) as exc:
        raise PluginSettingsError("sqlite", None, f"[thread_store]: {exc}") from None
    register(factory)
