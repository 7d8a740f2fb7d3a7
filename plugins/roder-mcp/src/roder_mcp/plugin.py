"""Registers the tools of the MCP servers in ``[mcp_servers.NAME]`` tables."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from roder_api import hookimpl
from roder_api.errors import DuplicateRegistrationError
from roder_api.tools import Tool
from roder_mcp._settings import McpSettingsError, ServerSettings

if TYPE_CHECKING:
    from roder_mcp._tools import McpTool

logger = logging.getLogger("roder_mcp")


class ToolNameClash(DuplicateRegistrationError):
    """A tool name two MCP servers produce (``a`` + ``x__pid`` and ``a__x`` + ``pid`` are
    both ``a__x__pid``): neither tool is used. ``first_source`` and ``second_source`` name
    the servers and their tools."""

    def __init__(self, name: str, first: str, second: str) -> None:
        super().__init__("tool", name, first, second)
        self.args = (
            f"MCP tool name {name!r} is produced by {first} and {second}; both are left "
            "out (rename a server in [mcp_servers])",
        )


def start_servers(
    tables: Mapping[str, Mapping[str, Any]],
) -> tuple[list[McpTool], dict[str, str]]:
    """Start every configured server at once; return their tools and why others failed.

    A table that is wrong raises ``McpSettingsError`` (nothing is started). A server that
    does not start is left out, with its reason in the returned mapping (by server name).
    A tool name two servers produce is left out, reported on the ``roder_mcp`` logger.
    """
    tools, failures, _ = _start_servers(tables)
    return tools, failures


def _start_servers(
    tables: Mapping[str, Mapping[str, Any]],
) -> tuple[list[McpTool], dict[str, str], list[ToolNameClash]]:
    """``start_servers``, and the tool names two servers produce (left out)."""
    settings = [ServerSettings.from_table(name, table) for name, table in tables.items()]
    if not settings:
        return [], {}, []
    # The mcp SDK is imported only when a server is configured (about a second).
    from roder_mcp._connection import McpServerDown, ServerConnection
    from roder_mcp._tools import McpTool

    connections = [ServerConnection(s) for s in settings]
    failures: dict[str, str] = {}
    tools: list[McpTool] = []
    if not connections:
        return tools, failures, []
    with ThreadPoolExecutor(max_workers=min(8, len(connections))) as pool:
        started = {c.name: pool.submit(c.start) for c in connections}
    for connection in connections:
        try:
            remote_tools = started[connection.name].result()
        except McpServerDown as exc:
            failures[connection.name] = str(exc)
            continue
        seen: set[str] = set()
        for remote in remote_tools:
            tool = McpTool(connection, remote, connection.settings)
            if tool.name in seen:
                logger.warning(
                    "MCP server %r: tool %r is left out, its name %r is taken by another of "
                    "its tools",
                    connection.name,
                    remote.name,
                    tool.name,
                )
                continue
            seen.add(tool.name)
            tools.append(tool)
    kept, clashes = _without_clashes(tools)
    used = {id(tool.connection) for tool in kept}
    for connection in connections:
        if id(connection) not in used and connection.name not in failures:
            connection.close()  # nothing of it is registered: nobody else would stop it
    return kept, failures, clashes


def _without_clashes(tools: list[McpTool]) -> tuple[list[McpTool], list[ToolNameClash]]:
    """Return ``tools`` less the names two servers produce (``a`` + ``x__pid`` and ``a__x``
    + ``pid`` are both ``a__x__pid``), and those clashes, each logged naming both servers.

    Neither is kept, as for a name two plugins register: which one the model would call
    cannot be told from the name. Every other tool stays.
    """
    by_name: dict[str, list[McpTool]] = {}
    for tool in tools:
        by_name.setdefault(tool.name, []).append(tool)
    clashes: list[ToolNameClash] = []
    for name, same in by_name.items():
        if len(same) > 1:
            first, *others = (
                f"server {t.connection.name!r} (its tool {t.remote_name!r})" for t in same
            )
            clash = ToolNameClash(name, first, " and ".join(others))
            logger.warning("%s", clash)
            clashes.append(clash)
    return [tool for tool in tools if len(by_name[tool.name]) == 1], clashes


def checked_tables(
    tables: Mapping[str, Any], misconfigured: Callable[[str, BaseException | str], None]
) -> dict[str, Mapping[str, Any]]:
    """Return the tables that are right; report each wrong one (id ``mcp_servers.NAME``)."""
    good: dict[str, Mapping[str, Any]] = {}
    for name, table in tables.items():
        try:
            if not isinstance(table, Mapping):
                raise McpSettingsError(f"[mcp_servers.{name}] must be a table")
            ServerSettings.from_table(name, table)
        except McpSettingsError as exc:
            misconfigured(f"mcp_servers.{name}", exc)
            continue
        good[name] = table
    return good


@hookimpl
def register_tools(
    register: Callable[[Tool], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
    check_only: bool,
) -> None:
    """Register the tools of every ``[mcp_servers.NAME]`` server, named ``NAME__tool``.

    A wrong table is reported through ``misconfigured`` (its server is not started); a
    server that fails to start is reported (a warning on the ``roder_mcp`` logger) and
    registers nothing; the other servers' tools still register. A tool name two servers
    produce is left out and reported through ``misconfigured`` as a ``ToolNameClash``
    (``roder plugins`` lists it as a tool conflict). ``check_only``: check the tables and
    start nothing.
    """
    tables = checked_tables(settings.get("mcp_servers") or {}, misconfigured)
    if check_only:
        return
    tools, failures, clashes = _start_servers(tables)
    for reason in failures.values():
        logger.warning("%s; its tools are not available", reason)
    for tool in tools:
        register(tool)
    for clash in clashes:
        misconfigured(clash.id, clash)  # listed as a tool conflict, naming both servers
