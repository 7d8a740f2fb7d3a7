"""MCP tools as Roder tools: ``NAME__tool``, called through the server's connection."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import mcp.types

from roder_api.codec import EXACT_MARK, dumps_json, find_unserializable
from roder_api.tools import EMPTY_PARAMETERS, Tool, ToolContext, ToolOutput
from roder_mcp._connection import ServerConnection
from roder_mcp._settings import ServerSettings

SEPARATOR = "__"
"""Between the server name and the tool name: ``files__read_file``."""


def tool_name(server: str, remote: str) -> str:
    """Return the Roder name of tool ``remote`` of ``server``: valid, at most 64 characters."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", remote) or "_"
    return f"{server}{SEPARATOR}{cleaned}"[:64]


def _chosen(setting: bool | frozenset[str], remote: str) -> bool:
    return setting if isinstance(setting, bool) else remote in setting


class McpTool(Tool):
    """One tool of an MCP server.

    Idempotent when the server marks it read-only or idempotent, or the server's table
    says so (``idempotent = true`` or a list of its tool names); likewise
    ``requires_approval``. ``timeout_s`` is the table's.
    """

    def __init__(
        self, connection: ServerConnection, remote: mcp.types.Tool, settings: ServerSettings
    ) -> None:
        self.connection = connection
        self.remote_name = remote.name
        self.name = tool_name(settings.name, remote.name)
        self.description = remote.description or remote.title or ""
        self.parameters = dict(remote.input_schema or EMPTY_PARAMETERS)
        hints = remote.annotations
        hinted = bool(hints and (hints.idempotent_hint or hints.read_only_hint))
        self.idempotent = hinted or _chosen(settings.idempotent, remote.name)
        self.requires_approval = _chosen(settings.requires_approval, remote.name)
        self.timeout_s = settings.timeout_s

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolOutput:
        """Call the tool on its server; a server that is down raises (an error result)."""
        result = await self.connection.call_tool(self.remote_name, dict(arguments))
        return to_output(result)

    async def aclose(self) -> None:
        """Close the server's connection (shared by its tools; closing twice is harmless)."""
        await self.connection.aclose()


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', '?')}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return str(text) if isinstance(text, str) else f"[resource: {resource.uri}]"
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    return f"[{kind or 'content'}]"


def to_output(result: mcp.types.CallToolResult) -> ToolOutput:
    """Return what the model sees of an MCP tool result: its text, structured data as JSON.

    ``structuredContent`` holding what JSON cannot (a server that writes NaN) is an error
    result saying where; integers of any size are written exactly.
    """
    parts = [_block_text(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    structured = result.structured_content
    if structured is not None:
        problem = find_unserializable(structured)
        if problem is not None:
            path, reason = problem
            return ToolOutput(
                f"the server's structuredContent is not JSON data: {path}: {reason}",
                is_error=True,
            )
    if not text and structured is not None:
        text = dumps_json(structured).removeprefix(EXACT_MARK).decode()
    return ToolOutput(text, is_error=bool(result.is_error), display_payload=structured)
