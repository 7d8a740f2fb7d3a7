"""The ``[temporal]`` table: where the Temporal service is and how runs are scheduled on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from roder_api.errors import PluginSettingsError

SETTINGS_ID = "temporal"
"""The key of the ``[temporal]`` table in the plugins' settings."""


@dataclass(frozen=True, slots=True)
class TemporalSettings:
    """The ``[temporal]`` table (same keys).

    ``address`` is the Temporal frontend (``host:port``), ``namespace`` and ``task_queue``
    where runs are scheduled, ``heartbeat_timeout_s`` how long a silent worker keeps a run
    before Temporal gives it to another worker (a dead worker's run waits that long),
    ``worker`` whether ``roder serve --dispatch temporal`` also answers runs itself (false:
    it only accepts and schedules them; ``roder temporal worker`` processes answer).
    """

    address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = "roder-runs"
    heartbeat_timeout_s: float = 30.0
    worker: bool = True

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None) -> TemporalSettings:
        """Return the settings of a ``[temporal]`` table; raise ``PluginSettingsError``
        (naming the key) for an unknown key or a bad value."""
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in (table or {}).items():
            if key not in known:
                choices = ", ".join(sorted(known))
                raise PluginSettingsError(SETTINGS_ID, key, f"unknown key (known: {choices})")
            changes[key] = _check(key, value)
        return replace(cls(), **changes)


def _check(key: str, value: Any) -> Any:
    def bad(expected: str) -> PluginSettingsError:
        return PluginSettingsError(SETTINGS_ID, key, f"expected {expected}, got {value!r}")

    if key == "worker":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key == "heartbeat_timeout_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise bad("a number of seconds above 0")
        return float(value)
    if not isinstance(value, str) or not value:
        raise bad("a non-empty string")
    return value
