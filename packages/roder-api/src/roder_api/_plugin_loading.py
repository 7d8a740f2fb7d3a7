"""Where plugins come from: the entry-point group, ``RODER_PLUGINS``, and importing a plugin
with a deadline (``RODER_PLUGIN_IMPORT_TIMEOUT``).

:class:`roder_api.extension.ExtensionRegistryBuilder` loads plugins with these; the public
names are importable from :mod:`roder_api.extension`.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Mapping
from typing import Any

from roder_api._markers import PROJECT_NAME

ENTRY_POINT_GROUP = PROJECT_NAME
"""The entry-point group plugins declare themselves in."""

PLUGINS_ENV = "RODER_PLUGINS"
"""Environment variable: a comma list of plugin names to load; empty loads none."""

NOT_INSTALLED = "not installed"
"""How ``PluginInfo.error`` starts for a name in ``RODER_PLUGINS`` that no plugin has."""

IMPORT_TIMEOUT_ENV = "RODER_PLUGIN_IMPORT_TIMEOUT"
"""Environment variable: seconds a plugin's import may take before it is reported failed."""

DEFAULT_IMPORT_TIMEOUT_S = 60.0
"""How long a plugin's import may take by default (generous: some import heavy libraries)."""


def plugin_names_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """Return the plugin names ``RODER_PLUGINS`` allows (None: unset, load all)."""
    env = os.environ if environ is None else environ
    raw = env.get(PLUGINS_ENV)
    if raw is None:
        return None
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def import_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """Return the plugin import deadline: ``RODER_PLUGIN_IMPORT_TIMEOUT`` or 60 seconds."""
    env = os.environ if environ is None else environ
    raw = env.get(IMPORT_TIMEOUT_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if value > 0 and value == value:  # not NaN
            return value
    return DEFAULT_IMPORT_TIMEOUT_S


def load_with_deadline(ep: importlib.metadata.EntryPoint, timeout: float) -> Any:
    """Return ``ep.load()``, or raise ``TimeoutError`` when it takes longer than ``timeout``.

    The import runs in a daemon thread so that a plugin that hangs at import (a network call,
    a lock, a bug) is reported as failed instead of hanging ``roder`` and every program that
    loads plugins. A hung import cannot be stopped: its thread is left behind, daemonic, and
    the plugin registers nothing. Whatever the import raises (even ``SystemExit``) is raised
    here, in the caller's thread.
    """
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def load() -> None:
        try:
            outcome.append(ep.load())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failure.append(exc)

    thread = threading.Thread(target=load, name=f"roder-plugin-import-{ep.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(
            f"importing {ep.value!r} did not finish within {timeout:g} s "
            f"(raise {IMPORT_TIMEOUT_ENV} if it is only slow)"
        )
    if failure:
        raise failure[0]
    return outcome[0]


def distribution_of(ep: importlib.metadata.EntryPoint) -> tuple[str | None, str | None, str | None]:
    """Return the version, name and summary of the distribution an entry point is from."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None, None
    metadata = dist.metadata
    return metadata["Version"], metadata["Name"], metadata["Summary"]


__all__ = [
    "DEFAULT_IMPORT_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "IMPORT_TIMEOUT_ENV",
    "NOT_INSTALLED",
    "PLUGINS_ENV",
    "distribution_of",
    "import_timeout_s",
    "load_with_deadline",
    "plugin_names_from_env",
]
