"""A real MCP server for the tests, written with the SDK's server side (``MCPServer``).

``python mcp_demo_server.py`` serves over stdio; ``python mcp_demo_server.py http PORT``
serves streamable HTTP on 127.0.0.1:PORT at ``/mcp``.
"""

from __future__ import annotations

import os
import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("roder-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def boom(why: str = "on purpose") -> str:
    """Fail."""
    raise ValueError(why)


@server.tool(name="slow.echo")
async def slow_echo(text: str, seconds: float = 0.2) -> str:
    """Echo a text after a pause."""
    await anyio.sleep(seconds)
    return text


@server.tool()
def pid() -> str:
    """Return the server's process id."""
    return str(os.getpid())


@server.tool()
def die() -> str:
    """Exit the server process at once."""
    sys.stdout.flush()
    time.sleep(0.05)
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
