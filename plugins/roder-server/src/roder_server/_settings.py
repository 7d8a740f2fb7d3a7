"""The ``[server]`` table: what ``roder serve`` and :func:`roder_server.create_app` take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from roder_api.errors import PluginSettingsError

SETTINGS_ID = "server"
"""The key of the ``[server]`` table in the plugins' settings."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How the server listens and what it allows (the ``[server]`` table, same keys).

    ``max_body_bytes`` bounds a request body (413 beyond), ``max_streams`` the open
    streams of one process (503 beyond), ``heartbeat_s`` the keepalive period of a stream,
    ``tokens_env`` the variable that holds the bearer tokens (``tok`` or ``tok=tenant``,
    comma-separated), ``cors_origins`` the origins allowed by CORS (none: CORS off),
    ``dispatch`` who answers accepted runs (``inprocess``, or a dispatcher plugin's id such
    as ``temporal``; docs/serve.md).
    """

    host: str = "127.0.0.1"
    port: int = 8321
    workers: int = 1
    max_body_bytes: int = 1024 * 1024
    max_streams: int = 1000
    heartbeat_s: float = 15.0
    tokens_env: str = "RODER_SERVER_TOKENS"
    cors_origins: tuple[str, ...] = field(default_factory=tuple)
    dispatch: str = "inprocess"

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None) -> ServerSettings:
        """Return the settings of a ``[server]`` table; raise ``PluginSettingsError`` (naming
        the key) for an unknown key or a bad value."""
        settings = cls()
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in (table or {}).items():
            if key not in known:
                choices = ", ".join(sorted(known))
                raise PluginSettingsError(SETTINGS_ID, key, f"unknown key (known: {choices})")
            changes[key] = _check(key, value)
        return replace(settings, **changes)


def _check(key: str, value: Any) -> Any:
    def bad(expected: str) -> PluginSettingsError:
        return PluginSettingsError(SETTINGS_ID, key, f"expected {expected}, got {value!r}")

    if key in ("host", "tokens_env", "dispatch"):
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        return value
    if key == "cors_origins":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad("a list of origins")
        return tuple(value)
    if key == "heartbeat_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise bad("a number of seconds above 0")
        return float(value)
    minimum = 0 if key == "port" else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad(f"an integer of at least {minimum}")
    if key == "port" and value > 65535:
        raise bad("a port number (0 to 65535)")
    return value
