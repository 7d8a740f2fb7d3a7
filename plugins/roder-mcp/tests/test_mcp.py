"""roder-mcp against real MCP servers (stdio and streamable HTTP) started by the tests."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import roder_mcp.plugin
from roder_api import ExtensionRegistryBuilder
from roder_api.errors import DuplicateRegistrationError
from roder_api.events import Event
from roder_api.transcript import ToolCallRecord
from roder_mcp import McpSettingsError, McpTool, ServerSettings, start_servers, tool_name
from roder_runtime import ToolsConfig
from roder_runtime.tools._tool_step import ToolStep

SERVER = str(Path(__file__).with_name("mcp_demo_server.py"))
STDIO = {"command": sys.executable, "args": [SERVER], "timeout_s": 10}


def by_name(tools: list[McpTool]) -> dict[str, McpTool]:
    return {t.name: t for t in tools}


@pytest.fixture(scope="module")
def demo() -> Iterator[dict[str, McpTool]]:
    """The demo server over stdio, started once for the module (its own thread and loop)."""
    tools, failures = start_servers({"demo": STDIO})
    assert failures == {}
    try:
        yield by_name(tools)
    finally:
        tools[0].connection.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The demo server over streamable HTTP, in a process of its own."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("the HTTP MCP server did not start")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(10)


async def run_calls(tools: dict[str, McpTool], *calls: ToolCallRecord) -> list[Any]:
    journal: list[Event] = []

    async def append(events: Any) -> None:
        journal.extend(events)

    step = ToolStep(thread_id="t", turn_id="u", tools=tools, config=ToolsConfig(), append=append)
    return await step.run(list(calls))


def test_tools_are_named_with_the_server_and_keep_their_schemas(
    demo: dict[str, McpTool],
) -> None:
    assert set(demo) == {"demo__add", "demo__boom", "demo__slow_echo", "demo__pid", "demo__die"}
    add = demo["demo__add"]
    assert add.remote_name == "add" and add.description == "Add two integers."
    assert add.parameters["required"] == ["a", "b"]
    assert add.idempotent  # the server says it is read-only
    assert not demo["demo__boom"].idempotent and add.timeout_s == 10
    assert demo["demo__slow_echo"].remote_name == "slow.echo"
    assert tool_name("x", "a" * 80) == "x__" + "a" * 61


@pytest.mark.anyio
async def test_calls_run_concurrently_and_errors_are_results(demo: dict[str, McpTool]) -> None:
    began = time.monotonic()
    results = await run_calls(
        demo,
        ToolCallRecord("1", "demo__add", '{"a": 2, "b": 3}'),
        ToolCallRecord("2", "demo__slow_echo", '{"text": "one", "seconds": 1.5}'),
        ToolCallRecord("3", "demo__slow_echo", '{"text": "two", "seconds": 1.5}'),
        ToolCallRecord("4", "demo__boom", '{"why": "broken"}'),
        ToolCallRecord("5", "demo__add", '{"a": "x"}'),
    )
    # One after the other the two 1.5 s calls take 3 s at least; the margin is for a loaded
    # CI machine (0.5 s calls with a 0.95 s bound failed there at 1.03 s).
    assert time.monotonic() - began < 2.9  # the two calls overlapped
    assert [(r.result, r.is_error) for r in results[:3]] == [
        ("5", False),
        ("one", False),
        ("two", False),
    ]
    assert results[3].is_error and "boom" in results[3].result
    assert results[4].is_error and "schema" in results[4].result  # checked before the call
    assert results[0].display_payload == {"result": 5}


@pytest.mark.anyio
async def test_a_call_past_its_deadline_is_cancelled_and_the_server_goes_on(
    demo: dict[str, McpTool],
) -> None:
    slow = demo["demo__slow_echo"]
    original = slow.timeout_s
    slow.timeout_s = 0.3
    try:
        (result,) = await run_calls(
            demo, ToolCallRecord("1", "demo__slow_echo", '{"text": "x", "seconds": 5}')
        )
    finally:
        slow.timeout_s = original
    assert result.is_error and result.result == "timed out after 0.3 s and was cancelled"
    (again,) = await run_calls(demo, ToolCallRecord("2", "demo__add", '{"a": 1, "b": 1}'))
    assert again.result == "2"


@pytest.mark.anyio
async def test_a_server_that_dies_answers_with_error_results() -> None:
    tools, failures = await anyio.to_thread.run_sync(start_servers, {"mortal": STDIO})
    assert failures == {}
    named = by_name(tools)
    try:
        died, after = await run_calls(
            named,
            ToolCallRecord("1", "mortal__die", "{}"),
            ToolCallRecord("2", "mortal__pid", "{}"),
        )
        assert died.is_error and "not running" in died.result
        (later,) = await run_calls(named, ToolCallRecord("3", "mortal__add", '{"a":1,"b":2}'))
        assert later.is_error
        assert later.result.startswith("the tool raised McpServerDown: MCP server 'mortal'")
    finally:
        await tools[0].aclose()


def test_a_server_that_fails_to_start_is_reported_and_the_others_register(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = {
        "mcp_servers": {
            "ghost": {"command": "/nonexistent/roder-mcp-server"},
            "good": STDIO,
        }
    }
    builder = ExtensionRegistryBuilder(settings=settings)
    with caplog.at_level(logging.WARNING, logger="roder_mcp"):
        info = builder.load_plugin("mcp", roder_mcp.plugin)
    registry = builder.build()
    try:
        assert info.error is None
        assert {n.split("__")[0] for n in registry.tools} == {"good"}
        assert "good__add" in info.tools
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            "MCP server 'ghost' (/nonexistent/roder-mcp-server) failed to start" in m
            and "its tools are not available" in m
            for m in messages
        ), messages
    finally:
        anyio.run(registry.aclose)


@pytest.mark.anyio
async def test_streamable_http_servers_work_like_stdio_ones(http_url: str) -> None:
    tools, failures = await anyio.to_thread.run_sync(
        start_servers, {"web": {"url": http_url, "startup_timeout_s": 20}}
    )
    assert failures == {}
    named = by_name(tools)
    try:
        assert "web__add" in named
        (result,) = await run_calls(named, ToolCallRecord("1", "web__add", '{"a": 20, "b": 22}'))
        assert result.result == "42" and not result.is_error
    finally:
        await tools[0].aclose()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"command": "x", "surprise": 1}, "unknown key 'surprise'"),
        ({"command": "x", "url": "http://x"}, "either `command`"),
        ({}, "either `command`"),
        ({"command": "x", "args": "not a list"}, "`args` must be a list"),
        ({"command": "x", "timeout_s": 0}, "`timeout_s` must be a number"),
        ({"command": "x", "idempotent": "yes"}, "`idempotent` must be"),
    ],
)
def test_bad_server_tables_name_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(McpSettingsError, match=message):
        ServerSettings.from_table("srv", table)
    with pytest.raises(McpSettingsError, match="server name"):
        ServerSettings.from_table("bad name", {"command": "x"})


def test_a_bad_table_is_reported_misconfigured_and_the_others_still_load() -> None:
    builder = ExtensionRegistryBuilder(
        settings={"mcp_servers": {"s": {"url": 3}, "t": {"comand": "x"}, "u": 3}}
    )
    info = builder.load_plugin("mcp", roder_mcp.plugin)
    assert "[mcp_servers.s]" in info.misconfigured["mcp_servers.s"]
    assert "'comand'" in info.misconfigured["mcp_servers.t"]
    assert "must be a table" in info.misconfigured["mcp_servers.u"]
    assert builder.build().misconfigured["mcp_servers.t"][0] == "mcp"


RAW = str(Path(__file__).with_name("mcp_raw_server.py"))


def raw(*tools: str) -> dict[str, Any]:
    """The table of a hand-written server (no SDK) offering ``tools``."""
    return {"command": sys.executable, "args": [RAW, *tools], "timeout_s": 10}


def test_servers_whose_tool_names_clash_are_reported_and_the_others_register(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # `a` + `x__pid` and `a__x` + `pid` are both `a__x__pid`.
    tables = {"a": raw("x__pid", "own"), "a__x": raw("pid"), "good": STDIO}
    builder = ExtensionRegistryBuilder(settings={"mcp_servers": tables})
    with caplog.at_level(logging.WARNING, logger="roder_mcp"):
        info = builder.load_plugin("mcp", roder_mcp.plugin)
    registry = builder.build()
    try:
        assert info.error is None, info.error
        assert "a__x__pid" not in registry.tools
        # Listed as a name two plugins would be: with the tools, as a conflict naming both.
        assert "a__x__pid" in info.tools and not info.misconfigured
        conflict = registry.tool_conflicts["a__x__pid"]
        assert "server 'a'" in conflict.first_source and "'x__pid'" in conflict.first_source
        assert "server 'a__x'" in conflict.second_source
        with pytest.raises(DuplicateRegistrationError):
            registry.tool("a__x__pid")
        assert {"a__own", "good__add", "good__pid"} <= set(registry.tools)
        messages = [r.getMessage() for r in caplog.records]
        clash = [m for m in messages if "a__x__pid" in m]
        assert clash and "'a'" in clash[0] and "'a__x'" in clash[0], messages
        assert "x__pid" in clash[0] and "left out" in clash[0]
        own = registry.tool("a__own")
        (result,) = anyio.run(run_calls, {"a__own": own}, ToolCallRecord("1", "a__own", "{}"))
        assert not result.is_error and result.result.isdigit()
    finally:
        anyio.run(registry.aclose)


@pytest.mark.anyio
async def test_structured_content_json_cannot_hold_is_an_error_result_the_model_sees(
    tmp_path: Path,
) -> None:
    from roder_api.testing import ScriptedEngine
    from roder_api.transcript import ToolResultRecord
    from roder_jsonl_thread_store import JsonlThreadStoreFactory
    from roder_runtime import Runtime, RuntimeConfig

    builder = ExtensionRegistryBuilder(settings={"mcp_servers": {"raw": raw()}})
    info = await anyio.to_thread.run_sync(builder.load_plugin, "mcp", roder_mcp.plugin)
    assert info.error is None, info.error
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        nan_reply = await runtime.run_turn(thread_id, "call raw__not_a_number")
        huge_reply = await runtime.run_turn(thread_id, "call raw__huge")
        page = await runtime.event_page(thread_id, limit=1000)
    results = [
        e.event.item
        for e in page.events
        if isinstance(getattr(e.event, "item", None), ToolResultRecord)
    ]
    nan, huge = results
    assert nan.is_error and "not JSON data" in nan.result and "v" in nan.result
    assert nan_reply is not None and "not JSON data" in nan_reply
    assert not huge.is_error and huge.result == '{"v":1180591620717411303424}'
    assert huge.display_payload == {"v": 2**70}
    assert huge_reply == 'raw__huge said: {"v":1180591620717411303424}'
