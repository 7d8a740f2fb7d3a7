"""Registers the JSONL thread store through the ``roder`` entry point."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError
from roder_api.storekit import StoreSettings
from roder_api.threads import ThreadStoreFactory
from roder_jsonl_thread_store._store import JsonlThreadStoreFactory


def default_base_path() -> Path:
    """Return ``$RODER_HOME/threads`` (``RODER_HOME`` defaults to ``~/.roder``)."""
    home = os.environ.get("RODER_HOME") or "~/.roder"
    return Path(home).expanduser() / "threads"


@hookimpl
def register_thread_store_factories(
    register: Callable[[ThreadStoreFactory], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register the ``jsonl`` factory, configured by the ``jsonl`` settings table.

    Settings: ``path``, ``durability`` (group (default), fsync, none), ``read_only`` and
    ``must_exist`` (booleans; see :class:`JsonlThreadStoreFactory`).
    """
    # A typo (`durabilty`) would otherwise be ignored and the store run with the default.
    table = StoreSettings(
        "jsonl", settings.get("jsonl"), ("path", "durability", "read_only", "must_exist")
    )
    base_path = table.path(default_base_path())
    durability = table.string("durability", "group") or "group"
    read_only, must_exist = table.flag("read_only"), table.flag("must_exist")
    try:
        factory = JsonlThreadStoreFactory(
            base_path=base_path,
            durability=durability,
            read_only=read_only,
            must_exist=must_exist,
        )
    except ValueError as exc:
        raise PluginSettingsError("jsonl", "durability", str(exc)) from None
    register(factory)
