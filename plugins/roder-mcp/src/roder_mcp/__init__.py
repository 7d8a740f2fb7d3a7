"""Roder tools from Model Context Protocol servers, on the official ``mcp`` SDK.

Each ``[mcp_servers.NAME]`` table names a server: ``command`` / ``args`` / ``env`` /
``cwd`` to run one over stdio, or ``url`` for streamable HTTP. Its tools register as
``NAME__tool`` (:class:`McpTool`); a server that fails to start is reported and left out,
and the tools of a server that dies answer with error results (:class:`McpServerDown`).
"""

from __future__ import annotations

from roder_mcp._connection import McpServerDown, ServerConnection
from roder_mcp._settings import McpSettingsError, ServerSettings
from roder_mcp._tools import McpTool, to_output, tool_name
from roder_mcp.plugin import start_servers

__version__ = "0.1.0"

__all__ = [
    "McpServerDown",
    "McpSettingsError",
    "McpTool",
    "ServerConnection",
    "ServerSettings",
    "__version__",
    "start_servers",
    "to_output",
    "tool_name",
]
