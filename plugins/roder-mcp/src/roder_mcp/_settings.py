"""``[mcp_servers.NAME]`` tables: how to reach one MCP server, checked key by key."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roder_api.errors import PluginSettingsError

SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""What a server name must match (it prefixes its tools' names: ``NAME__tool``)."""

DEFAULT_STARTUP_TIMEOUT_S = 30.0
"""How long a server may take to start and list its tools."""

_KEYS = (
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "timeout_s",
    "startup_timeout_s",
    "idempotent",
    "requires_approval",
)


_WHERE = re.compile(r"\[mcp_servers\.([^\]]+)\](?:: (?:unknown key '([^']+)'|`(\w+)`))?")


class McpSettingsError(PluginSettingsError):
    """Raised when an ``[mcp_servers.NAME]`` table is wrong; the message names the key.

    A ``PluginSettingsError`` (a ``ValueError`` too) for the ``mcp_servers`` table, its
    ``setting`` the dotted key (``NAME.comand``, or ``NAME`` for the table), so that the
    runtime says in which file and on which line it was written.
    """

    def __init__(self, message: str) -> None:
        found = _WHERE.match(message)
        setting = None
        if found:
            key = found.group(2) or found.group(3)
            setting = f"{found.group(1)}.{key}" if key else found.group(1)
        super().__init__("mcp_servers", setting, message)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """One MCP server: a command to run (stdio) or a URL (streamable HTTP), and limits.

    ``idempotent`` and ``requires_approval`` name the server's tools (without the prefix)
    that are idempotent or need approval; ``True`` means all of them.
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    idempotent: bool | frozenset[str] = False
    requires_approval: bool | frozenset[str] = False

    @classmethod
    def from_table(cls, name: str, table: Mapping[str, Any]) -> ServerSettings:
        """Return the settings of server ``name``; raise ``McpSettingsError`` naming the key."""
        where = f"[mcp_servers.{name}]"
        if not isinstance(name, str) or SERVER_NAME.fullmatch(name) is None:
            raise McpSettingsError(f"{where}: a server name is 1 to 40 letters, digits, '_' or '-'")
        for key in table:
            if key not in _KEYS:
                raise McpSettingsError(
                    f"{where}: unknown key {key!r}; known keys: {', '.join(_KEYS)}"
                )
        command = _optional_str(table, "command", where)
        url = _optional_str(table, "url", where)
        if (command is None) == (url is None):
            raise McpSettingsError(f"{where}: set either `command` (stdio) or `url` (HTTP)")
        return cls(
            name=name,
            command=command,
            args=tuple(_str_list(table, "args", where)),
            env=_str_map(table, "env", where) if "env" in table else None,
            cwd=_optional_str(table, "cwd", where),
            url=url,
            headers=_str_map(table, "headers", where) if "headers" in table else {},
            timeout_s=_seconds(table, "timeout_s", where, None),
            startup_timeout_s=_seconds(table, "startup_timeout_s", where, DEFAULT_STARTUP_TIMEOUT_S)
            or DEFAULT_STARTUP_TIMEOUT_S,
            idempotent=_tool_set(table, "idempotent", where),
            requires_approval=_tool_set(table, "requires_approval", where),
        )

    def describe(self) -> str:
        """Return how the server is reached, for messages (``python -m srv`` or the URL)."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args]).strip()


def _optional_str(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise McpSettingsError(f"{where}: `{key}` must be a non-empty string, got {value!r}")
    return value


def _str_list(table: Mapping[str, Any], key: str, where: str) -> Sequence[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpSettingsError(f"{where}: `{key}` must be a list of strings, got {value!r}")
    return value


def _str_map(table: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key)
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise McpSettingsError(f"{where}: `{key}` must be a table of strings, got {value!r}")
    return dict(value)


def _seconds(table: Mapping[str, Any], key: str, where: str, default: float | None) -> float | None:
    value = table.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise McpSettingsError(f"{where}: `{key}` must be a number of seconds above 0")
    return float(value)


def _tool_set(table: Mapping[str, Any], key: str, where: str) -> bool | frozenset[str]:
    value = table.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise McpSettingsError(f"{where}: `{key}` must be true, false or a list of tool names")
