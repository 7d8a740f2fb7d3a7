"""docs/tools.md's promises tried at their edges, through ``run_turn`` and a session.

Failure is data and no call is left without a result: a schema the validator cannot use,
a result the journal cannot hold, a blocking tool that an interrupt cannot stop; and a
pending approval outlives the session that asked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from roder_api.events import (
    ItemCompleted,
    ToolApprovalRequested,
    ToolCallStarted,
    TurnAborted,
    TurnComplete,
)
from roder_api.testing import ScriptedEngine
from roder_api.tools import Tool, ToolContext, ToolOutput, tool
from roder_api.transcript import ToolResultRecord
from roder_runtime import ApproveToolCall, Interrupt, UserInput

from .test_agent_loop import items_of, journal, runtime_with, unanswered, until

pytestmark = pytest.mark.anyio


class Fixed(Tool):
    """A tool with a schema given by the test that returns what it is told to."""

    def __init__(self, name: str, parameters: Mapping[str, Any], output: Any = "ran") -> None:
        self.name = name
        self.description = f"{name} tool"
        self.parameters = parameters
        self.output = output
        self.runs = 0

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
        self.runs += 1
        return self.output


RECURSIVE = {
    "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
    "$ref": "#/$defs/node",
}


def nested(depth: int) -> str:
    text = "{}"
    for _ in range(depth):
        text = '{"child": ' + text + "}"
    return text


async def one_call_turn(tmp_path: Path, message: str, *tools: Tool) -> tuple[str | None, list[Any]]:
    runtime = runtime_with(tmp_path, ScriptedEngine(), *tools)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, message)
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    return reply, events


@pytest.mark.parametrize(
    ("parameters", "arguments", "reason"),
    [
        (
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
            '{"x": 1}',
            "the tool's own schema is invalid",
        ),
        (RECURSIVE, nested(300), "could not be checked against the tool's schema"),
        (
            {"type": "object", "properties": {1: {"type": "string"}}},
            "{}",
            "the tool's own schema is invalid",
        ),
    ],
    ids=["unresolvable-ref", "recursive-300-deep", "schema-not-json"],
)
async def test_a_schema_the_validator_cannot_use_is_an_error_result(
    tmp_path: Path, parameters: dict[str, Any], arguments: str, reason: str
) -> None:
    broken = Fixed("broken", parameters)
    reply, events = await one_call_turn(tmp_path, f"call broken {arguments}", broken)
    (result,) = items_of(events, ToolResultRecord)
    assert result.is_error and reason in result.result
    assert "\n" not in result.result and broken.runs == 0
    assert isinstance(events[-1], TurnComplete)  # the turn went on: the model saw the error
    assert reply is not None and reason in reply
    assert unanswered(events) == []


@tool
def not_a_number() -> dict[str, float]:
    """Return a value JSON cannot hold."""
    return {"v": math.nan}


@tool
def huge() -> dict[str, int]:
    """Return an integer over 64 bits (JSON holds it; orjson does not)."""
    return {"v": 2**70}


@pytest.mark.parametrize(
    ("tools", "message", "problem"),
    [
        (
            (Fixed("nan", {"type": "object"}, ToolOutput("x", display_payload=[1, math.nan])),),
            "call nan",
            "display_payload[1]",
        ),
        (
            (Fixed("inf", {"type": "object"}, ToolOutput("x", display_payload={"v": math.inf})),),
            "call inf",
            "display_payload.v",
        ),
        ((not_a_number,), "call not_a_number", "v"),
    ],
    ids=["nan-display-payload", "infinity-display-payload", "nan-returned"],
)
async def test_a_result_outside_the_value_rule_is_an_error_result(
    tmp_path: Path, tools: tuple[Tool, ...], message: str, problem: str
) -> None:
    reply, events = await one_call_turn(tmp_path, message, *tools)
    started = [i for i, e in enumerate(events) if isinstance(e, ToolCallStarted)]
    (result,) = items_of(events, ToolResultRecord)
    at = next(i for i, e in enumerate(events) if isinstance(e, ItemCompleted) and e.item is result)
    assert started and started[0] < at
    assert result.is_error and "not JSON data" in result.result and problem in result.result
    assert result.display_payload is None
    assert isinstance(events[-1], TurnComplete) and reply is not None and "not JSON" in reply
    assert unanswered(events) == []


async def test_an_integer_over_64_bits_is_json_the_model_sees(tmp_path: Path) -> None:
    reply, events = await one_call_turn(tmp_path, "call huge", huge)
    (result,) = items_of(events, ToolResultRecord)
    assert not result.is_error and result.result == '{"v":1180591620717411303424}'
    assert reply == 'huge said: {"v":1180591620717411303424}'


async def test_an_interrupted_blocking_tool_is_abandoned_not_cancelled(tmp_path: Path) -> None:
    marker = tmp_path / "written"
    running, written = anyio.Event(), anyio.Event()
    token = anyio.lowlevel.current_token()

    @tool
    def slow_write() -> str:
        """Write a file after a pause (a blocking function: it cannot be stopped)."""
        anyio.from_thread.run_sync(running.set, token=token)
        time.sleep(1.0)
        marker.write_text("done")
        anyio.from_thread.run_sync(written.set, token=token)
        return "written"

    runtime = runtime_with(tmp_path, ScriptedEngine(), slow_write)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("call slow_write"))
            assert turn_id is not None
            with anyio.fail_after(20):
                await running.wait()
            await session.submit(Interrupt(turn_id))
            done = await until(session, TurnAborted)
        events = [e.event for e in done]
    finally:
        await runtime.aclose()
    (result,) = items_of(events, ToolResultRecord)
    assert not marker.exists()  # the turn ended while the function still ran
    assert result.is_error and "cancelled" not in result.result
    assert "abandoned" in result.result and "may still be running" in result.result
    with anyio.fail_after(10):
        await written.wait()  # ... and it took effect afterwards, as the result said
    assert marker.read_text() == "done"
    assert isinstance(events[-1], TurnAborted)


async def test_closing_a_session_at_a_pending_approval_leaves_it_pending(tmp_path: Path) -> None:
    runs: list[str] = []

    @tool(requires_approval=True)
    def send(to: str) -> str:
        """Send a message (asks first)."""
        runs.append(to)
        return f"sent to {to}"

    runtime = runtime_with(tmp_path, ScriptedEngine(), send)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            await session.submit(UserInput('call send {"to": "bob"}'))
            asked = (await until(session, ToolApprovalRequested))[-1].event
        # Closed with the question open: no "not run" result, no end of the turn.
        after_close = await journal(runtime, thread_id)
        assert items_of(after_close, ToolResultRecord) == []
        assert not any(isinstance(e, (TurnAborted, TurnComplete)) for e in after_close)
        async with runtime.start_session(thread_id) as session:
            assert session.resumed_turn_id == asked.turn_id
            again = (await until(session, ToolApprovalRequested))[-1].event  # nothing typed
            assert again.call_id == asked.call_id
            await session.submit(ApproveToolCall(again.call_id, True))
            done = await until(session, TurnComplete)
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    assert runs == ["bob"] and done[-1].event.last_assistant_message == "send said: sent to bob"
    assert unanswered(events) == []


class BrokenTimeout(Fixed):
    """A tool whose own attribute raises when the step reads it (a plugin's bug)."""

    @property  # type: ignore[override]
    def timeout_s(self) -> float | None:
        raise RuntimeError("the deadline could not be computed")


async def test_a_tool_that_breaks_the_step_itself_still_gets_an_error_result(
    tmp_path: Path,
) -> None:
    broken = BrokenTimeout("broken", {"type": "object"})
    reply, events = await one_call_turn(tmp_path, "call broken", broken)
    (result,) = items_of(events, ToolResultRecord)
    assert result.is_error and "RuntimeError: the deadline could not be computed" in result.result
    assert isinstance(events[-1], TurnComplete) and unanswered(events) == []
