"""Client tools: a turn offers tools the caller runs; their calls end the turn, left open,
and the next turn's input answers them (also after a restart)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import ToolCallNotOpenError
from roder_api.events import Event, ItemCompleted, TurnAborted, TurnComplete, TurnStarted
from roder_api.inference import ToolSpec
from roder_api.testing import ScriptedEngine
from roder_api.tools import Tool
from roder_api.transcript import ToolCallRecord, ToolResultRecord, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, UserInput

from .session_support import add

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec(
    "weather",
    "Return the weather of a city (the caller runs it).",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def runtime_with(tmp_path: Path, engine: ScriptedEngine, *tools: Tool) -> Runtime:
    builder = ExtensionRegistryBuilder().inference_engine(engine)
    for t in tools:
        builder.tool(t)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    return Runtime(builder.build(), RuntimeConfig())


async def journal(runtime: Runtime, thread_id: str) -> list[Event]:
    page = await runtime.event_page(thread_id, limit=1000)
    return [e.event for e in page.events]


def items(events: Sequence[Event], kind: type) -> list[Any]:
    return [e.item for e in events if isinstance(e, ItemCompleted) and isinstance(e.item, kind)]


async def test_a_client_tool_call_ends_the_turn_open_and_the_next_turn_answers_it_after_a_restart(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine()
    runtime = runtime_with(tmp_path, engine)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(
            thread_id, 'call weather {"city": "Oslo"}', client_tools=[WEATHER]
        )
        assert reply == ""
        assert engine.requests[-1][1].tools == (WEATHER,)
        first = await journal(runtime, thread_id)
        assert items(first, ToolCallRecord) == [
            ToolCallRecord("call_1_weather", "weather", '{"city": "Oslo"}')
        ]
        assert items(first, ToolResultRecord) == []
        assert isinstance(first[-1], TurnComplete)
    finally:
        await runtime.aclose()

    # A restart: a new runtime on the same store. Opening a session runs the crash rules:
    # the open call belongs to a completed turn, so nothing closes it.
    engine = ScriptedEngine()
    runtime = runtime_with(tmp_path, engine)
    try:
        async with runtime.start_session(thread_id) as session:
            await session.flush()
        assert await journal(runtime, thread_id) == first
        reply = await runtime.run_turn(
            thread_id,
            "",
            client_tools=[WEATHER],
            tool_results=[ToolResultRecord("call_1_weather", "", "sunny, 21 C")],
        )
        assert reply == "weather said: sunny, 21 C"
        events = await journal(runtime, thread_id)
        second = events[len(first) :]
        assert isinstance(second[0], TurnStarted)
        # The result (named after its call) is the turn's input, before its model step;
        # an empty text adds no user message.
        assert second[1] == ItemCompleted(
            second[0].turn_id, ToolResultRecord("call_1_weather", "weather", "sunny, 21 C")
        )
        assert items(second, UserMessage) == []
        transcript = engine.requests[-1][1].transcript
        assert [type(i).__name__ for i in transcript] == [
            "UserMessage",
            "ToolCallRecord",
            "ToolResultRecord",
        ]
        assert isinstance(events[-1], TurnComplete)
        assert not any(isinstance(e, TurnAborted) for e in events)
    finally:
        await runtime.aclose()


async def test_a_result_for_an_unknown_or_answered_call_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    runtime = runtime_with(tmp_path, ScriptedEngine())
    try:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "call weather", client_tools=[WEATHER])
        before = await journal(runtime, thread_id)
        with pytest.raises(ToolCallNotOpenError, match="'call_nope' is not open"):
            await runtime.run_turn(
                thread_id, "", tool_results=[ToolResultRecord("call_nope", "", "x")]
            )
        twice = [ToolResultRecord("call_1_weather", "", "a")] * 2
        with pytest.raises(ToolCallNotOpenError, match="already answered"):
            await runtime.run_turn(thread_id, "", tool_results=twice)
        assert await journal(runtime, thread_id) == before
        await runtime.run_turn(thread_id, "", tool_results=twice[:1])
        answered = await journal(runtime, thread_id)
        with pytest.raises(ToolCallNotOpenError, match="'call_1_weather' is not open"):
            await runtime.run_turn(thread_id, "", tool_results=twice[:1])
        assert await journal(runtime, thread_id) == answered
    finally:
        await runtime.aclose()


async def test_registered_tools_run_and_client_calls_of_the_same_step_stay_open(
    tmp_path: Path,
) -> None:
    runtime = runtime_with(tmp_path, ScriptedEngine(), add)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(
            thread_id, 'call add {"a": 2, "b": 3}; call weather', client_tools=[WEATHER]
        )
        events = await journal(runtime, thread_id)
        assert [c.name for c in items(events, ToolCallRecord)] == ["add", "weather"]
        assert items(events, ToolResultRecord) == [ToolResultRecord("call_1_add", "add", "5")]
        assert isinstance(events[-1], TurnComplete)
        reply = await runtime.run_turn(
            thread_id,
            "",
            client_tools=[WEATHER],
            tool_results=[ToolResultRecord("call_2_weather", "", "rain")],
        )
        assert reply == "add said: 5; weather said: rain"
    finally:
        await runtime.aclose()


async def test_a_session_takes_client_tools_and_results_as_user_input(tmp_path: Path) -> None:
    runtime = runtime_with(tmp_path, ScriptedEngine(), add)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            with pytest.raises(ValueError, match="clash"):
                await session.submit(UserInput("call add", (ToolSpec("add"),)))
            first = await session.submit(UserInput("call weather", (WEATHER,)))
            done: list[str] = []
            with anyio.fail_after(20):
                while len(done) < 2:
                    event = (await session.next_event()).event
                    if isinstance(event, TurnComplete):
                        done.append(event.last_assistant_message or "")
                    if isinstance(event, TurnComplete) and event.turn_id == first:
                        # The call is journaled (and open) once its turn ends.
                        second = await session.submit_input(
                            "thanks",
                            tool_results=[ToolResultRecord("call_1_weather", "", "fog")],
                        )
        assert done == ["", "You said: thanks"]
        events = await journal(runtime, thread_id)
        answer = [e for e in events if getattr(e, "turn_id", None) == second]
        assert [type(e.item).__name__ for e in answer if isinstance(e, ItemCompleted)][:2] == [
            "ToolResultRecord",
            "UserMessage",
        ]
        assert first != second
    finally:
        await runtime.aclose()
