"""Registers the SQLite thread store (id ``sqlite``) through the ``roder`` entry point."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError
from roder_api.storekit import StoreSettings
from roder_api.threads import ThreadStoreFactory
from roder_sqlite_thread_store._store import SqliteThreadStoreFactory


def default_path() -> Path:
    """Return ``$RODER_HOME/threads.sqlite3`` (``RODER_HOME`` defaults to ``~/.roder``)."""
    home = os.environ.get("RODER_HOME") or "~/.roder"
    return Path(home).expanduser() / "threads.sqlite3"


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
    table = StoreSettings(
        "sqlite",
        settings.get("sqlite"),
        ("path", "durability", "busy_timeout_s", "read_only", "must_exist"),
    )
    try:
        factory = SqliteThreadStoreFactory(
            table.path(default_path()),
            durability=table.string("durability", "fsync") or "fsync",
            busy_timeout_s=table.seconds("busy_timeout_s", 30.0),
            read_only=table.flag("read_only"),
            must_exist=table.flag("must_exist"),
        )
    except PluginSettingsError:
        raise
    except (TypeError, ValueError) as exc:
        raise PluginSettingsError("sqlite", "durability", f"[thread_store]: {exc}") from None
    register(factory)
