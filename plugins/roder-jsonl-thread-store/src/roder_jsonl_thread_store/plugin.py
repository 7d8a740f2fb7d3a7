"""Registers the JSONL thread store through the ``roder`` entry point."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError, check_settings
from roder_api.threads import ThreadStoreFactory
from roder_jsonl_thread_store._store import JsonlThreadStoreFactory


def default_base_path() -> Path:
    """Return ``$RODER_HOME/threads`` (``RODER_HOME`` defaults to ``~/.roder``)."""
    home = os.environ.get("RODER_HOME") or "~/.roder"
    return Path(home).expanduser() / "threads"


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
    """Register the ``jsonl`` factory, configured by the ``jsonl`` settings table.

    Settings: ``path``, ``durability`` (group (default), fsync, none), ``read_only`` and
    ``must_exist`` (booleans; see :class:`JsonlThreadStoreFactory`).
    """
    table = settings.get("jsonl", {})
    # A typo (`durabilty`) would otherwise be ignored and the store run with the default.
    check_settings("jsonl", table, ("path", "durability", "read_only", "must_exist"))
    path = table.get("path")
    try:
        factory = JsonlThreadStoreFactory(
            base_path=Path(str(path)).expanduser() if path else default_base_path(),
            durability=str(table.get("durability", "group")),
            read_only=_flag(table.get("read_only", False)),
            must_exist=_flag(table.get("must_exist", False)),
        )
    except ValueError as exc:
        raise PluginSettingsError("jsonl", "durability", str(exc)) from None
    register(factory)
