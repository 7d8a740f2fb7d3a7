"""Roder tools from Model Context Protocol servers, on the official ``mcp`` SDK.

Each ``[mcp_servers.NAME]`` table names a server: ``command`` / ``args`` / ``env`` /
``cwd`` to run one over stdio, or ``url`` for streamable HTTP. Its tools register as
``NAME__tool`` (:class:`McpTool`); a server that fails to start is reported and left out,
and the tools of a server that dies answer with error results (:class:`McpServerDown`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api import lazy_exports
from roder_mcp._settings import McpSettingsError, ServerSettings

if TYPE_CHECKING:
    from roder_mcp._connection import McpServerDown, ServerConnection
    from roder_mcp._tools import McpTool, to_output, tool_name
    from roder_mcp.plugin import start_servers

# The mcp SDK takes about a second to import: it is imported with the first name that needs
# it, so that a turn without [mcp_servers] (the plugin is loaded for any turn's tools) does
# not pay for it.
_LATER = {
    "McpServerDown": "roder_mcp._connection",
    "ServerConnection": "roder_mcp._connection",
    "McpTool": "roder_mcp._tools",
    "to_output": "roder_mcp._tools",
    "tool_name": "roder_mcp._tools",
    "start_servers": "roder_mcp.plugin",
}


__getattr__, __dir__ = lazy_exports(__name__, _LATER)


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
