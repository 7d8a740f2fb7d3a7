"""One live connection to an MCP server, held by a thread and an event loop of its own.

The ``mcp`` SDK's client is a context manager that must be entered and left in one task,
and it must outlive every turn that calls its tools. So each server gets a daemon thread
running its own anyio loop: the thread enters the client, lists the tools, and waits until
it is told to stop; tool calls reach it through an anyio ``BlockingPortal``. The runtime's
loop (asyncio or trio) only ever waits on a ``concurrent.futures.Future`` in a worker
thread, and cancels that future when the call is cancelled.

A server that dies is noticed by its next (or current) call: the SDK reports "connection
closed", the connection is marked down, and every later call raises
:class:`McpServerDown` at once (the runtime turns it into an error result).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp
import mcp.types

from roder_mcp._settings import ServerSettings

if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10 only
    from exceptiongroup import BaseExceptionGroup


class McpServerDown(RuntimeError):
    """Raised when a tool is called on a server that failed to start or has stopped."""


class ServerConnection:
    """A connection to the MCP server ``settings`` describes (see the module docstring)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.tools: Sequence[mcp.types.Tool] = ()
        self.down: str | None = "not started"
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._stop: anyio.Event | None = None
        self._client: mcp.Client | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """Return the server's configured name."""
        return self.settings.name

    def start(self) -> Sequence[mcp.types.Tool]:
        """Start the server (or connect to it) and return its tools; blocking.

        Raise :class:`McpServerDown` saying why when it does not start within
        ``startup_timeout_s``.
        """
        self._thread = threading.Thread(
            target=self._run, name=f"roder-mcp-{self.name}", daemon=True
        )
        self._thread.start()
        timeout = self.settings.startup_timeout_s
        if not self._ready.wait(timeout):
            self.down = f"it did not start within {timeout:g} s"
            self.close()
        if self.down is not None:
            raise McpServerDown(
                f"MCP server {self.name!r} ({self.settings.describe()}) failed to start: "
                f"{self.down}"
            )
        return self.tools

    def _target(self) -> mcp.StdioServerParameters | str:
        settings = self.settings
        if settings.url is not None:
            return settings.url
        assert settings.command is not None
        return mcp.StdioServerParameters(
            command=settings.command,
            args=list(settings.args),
            env=dict(settings.env) if settings.env is not None else None,
            cwd=settings.cwd,
        )

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:  # noqa: BLE001 - the thread reports, it never raises
            self.down = _describe(exc)
        finally:
            if self.down is None:
                self.down = "the connection was closed"
            self._ready.set()

    async def _main(self) -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            self._stop = anyio.Event()
            try:
                async with mcp.Client(self._target()) as client:
                    tools: list[mcp.types.Tool] = []
                    cursor: str | None = None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools += page.tools
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    self.tools = tuple(tools)
                    self._client = client
                    self._portal = portal
                    self.down = None
                    self._ready.set()
                    await self._stop.wait()
            except Exception as exc:  # noqa: BLE001 - a failed start or a dead server
                self.down = _describe(exc)
            finally:
                self._client = None
                if self.down is None:
                    self.down = "the connection was closed"

    async def _call(self, name: str, arguments: dict[str, Any]) -> mcp.types.CallToolResult:
        client = self._client
        if client is None:
            raise McpServerDown(self._down_message())
        try:
            return await client.call_tool(name, arguments)
        except mcp.MCPError as exc:
            if "closed" in str(exc).lower():
                self.down = f"the connection was closed ({exc})"
                raise McpServerDown(self._down_message()) from exc
            raise

    def _down_message(self) -> str:
        return f"MCP server {self.name!r} is not running: {self.down}"

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp.types.CallToolResult:
        """Call tool ``name`` of the server; raise :class:`McpServerDown` when it is down."""
        portal = self._portal
        if self.down is not None or portal is None:
            raise McpServerDown(self._down_message())
        try:
            future: Future[mcp.types.CallToolResult] = portal.start_task_soon(
                self._call, name, arguments
            )
        except RuntimeError as exc:  # the portal stopped: the server's loop has ended
            raise McpServerDown(self._down_message()) from exc
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            future.cancel()  # the call's task on the server's loop is cancelled too
            raise
        except FutureCancelled as exc:
            raise McpServerDown(self._down_message()) from exc

    def close(self) -> None:
        """Stop the connection (and a stdio server); blocking, waits a few seconds at most."""
        portal, stop = self._portal, self._stop
        self._portal = None
        if self.down is None:
            self.down = "the connection was closed"
        if portal is not None and stop is not None:
            try:
                portal.call(stop.set)
            except RuntimeError:
                pass  # its loop has already ended
        if self._thread is not None:
            self._thread.join(5)

    async def aclose(self) -> None:
        """Stop the connection without blocking the event loop."""
        await anyio.to_thread.run_sync(self.close)


def _describe(exc: BaseException) -> str:
    """Return a one-line reason for a failure, looking inside exception groups."""
    inner: BaseException = exc
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    text = str(inner) or type(inner).__name__
    return " ".join(f"{type(inner).__name__}: {text}".split())
