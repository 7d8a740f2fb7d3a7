"""A real MCP server written by hand, without the SDK (as a server in another language is).

It speaks newline-delimited JSON-RPC on stdio and writes its JSON with the standard library,
which writes NaN as ``NaN`` and integers of any size exactly: what the SDK's server never
sends, but a server may. ``python mcp_raw_server.py [TOOL ...]`` offers the named tools
(default: all of them):

- ``not_a_number``: structuredContent ``{"v": NaN}`` and no text content;
- ``huge``: structuredContent ``{"v": 2**70}`` and no text content;
- any other name: its text content is the server's process id.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

STRUCTURED: dict[str, Any] = {"not_a_number": {"v": math.nan}, "huge": {"v": 2**70}}


def answer(request: dict[str, Any], tools: list[str]) -> dict[str, Any] | None:
    """Return the response to one JSON-RPC message (None for a notification)."""
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:
        return None
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
    if method == "initialize":
        reply["result"] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        schema = {"type": "object", "properties": {}}
        reply["result"] = {"tools": [{"name": n, "inputSchema": schema} for n in tools]}
    elif method == "tools/call":
        name = params.get("name")
        if name in STRUCTURED:
            reply["result"] = {"content": [], "structuredContent": STRUCTURED[name]}
        else:
            reply["result"] = {"content": [{"type": "text", "text": str(os.getpid())}]}
    elif method == "ping":
        reply["result"] = {}
    else:
        reply["error"] = {"code": -32601, "message": f"no method {method}"}
    return reply


def main() -> None:
    tools = sys.argv[1:] or [*STRUCTURED, "pid"]
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line), tools)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
