"""Reading a ``[thread_store]`` table: typed values, errors that name the key.

A store plugin wraps its table in :class:`StoreSettings` and reads each key with the reader
for its kind; a value of the wrong kind raises ``PluginSettingsError`` naming the store and
the key, so that the runtime puts the file and line in front of the reason (instead of a
bare ``could not convert string to float``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from roder_api.errors import PluginSettingsError, check_settings


class StoreSettings:
    """One store's settings table, checked against ``known`` keys, read key by key."""

    def __init__(
        self, store_id: str, table: Mapping[str, Any] | None, known: Iterable[str]
    ) -> None:
        check_settings(store_id, table, known)
        self.store_id = store_id
        self.values: dict[str, Any] = dict(table or {})

    def fail(self, key: str, expected: str) -> PluginSettingsError:
        """Return the error for ``key`` holding something other than ``expected``."""
        return PluginSettingsError(
            self.store_id,
            key,
            f"[thread_store] {key}: expected {expected}, got {self.values.get(key)!r}",
        )

    def path(self, default: Path) -> Path:
        """Return ``path`` expanded (``default`` when absent); it must be a non-empty string."""
        value = self.values.get("path")
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise self.fail("path", "a path (a non-empty string)")
        return Path(value).expanduser()

    def string(self, key: str, default: str | None) -> str | None:
        """Return a string value (``default`` when absent)."""
        value = self.values.get(key, default)
        if value is not None and not isinstance(value, str):
            raise self.fail(key, "a string")
        return value

    def seconds(self, key: str, default: float) -> float:
        """Return a positive, finite number of seconds (``default`` when absent)."""
        value = self.values.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise self.fail(key, "a number of seconds above 0")
        return float(value)

    def integer(self, key: str, default: int, minimum: int = 1) -> int:
        """Return an integer of at least ``minimum`` (``default`` when absent)."""
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"an integer of at least {minimum}")
        return value

    def flag(self, key: str) -> bool:
        """Return a boolean given as true/false or as text (``"true"``, ``"1"``; env vars)."""
        value = self.values.get(key, False)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in {"1", "true", "yes", "on"}:
            return True
        if isinstance(value, str) and value.strip().lower() in {"0", "false", "no", "off", ""}:
            return False
        raise self.fail(key, "true or false")
