"""The scripted engine's tool calls: ``call NAME [JSON]`` asks for them, results answer."""

from __future__ import annotations

import pytest

from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ToolCallCompleted,
    ToolSpec,
)
from roder_api.testing import ScriptedEngine, tool_call
from roder_api.transcript import ToolCallRecord, ToolResultRecord, TranscriptItem, UserMessage

pytestmark = pytest.mark.anyio

CTX = InferenceTurnContext("t", "turn", "step")
TOOLS = (ToolSpec("add"), ToolSpec("echo"))


async def stream(
    engine: ScriptedEngine, items: list[TranscriptItem], tools: tuple[ToolSpec, ...] = TOOLS
) -> list[InferenceEvent]:
    request = AgentInferenceRequest("scripted-1", None, items, tools)
    return [e async for e in engine.stream_turn(CTX, request)]


async def test_call_text_asks_for_tools_and_results_are_answered() -> None:
    engine = ScriptedEngine()
    user = UserMessage('call add {"a": 1, "b": 2}; call echo')
    first = await stream(engine, [user])
    calls = [e for e in first if isinstance(e, ToolCallCompleted)]
    assert calls == [
        ToolCallCompleted("call_1_add", "add", '{"a": 1, "b": 2}'),
        ToolCallCompleted("call_2_echo", "echo", "{}"),
    ]
    assert first[-1] == Completed("tool_calls")
    history: list[TranscriptItem] = [user]
    history += [ToolCallRecord(c.id, c.name, c.arguments) for c in calls]
    history += [
        ToolResultRecord("call_1_add", "add", "3"),
        ToolResultRecord("call_2_echo", "echo", "hi"),
    ]
    second = await stream(engine, history)
    text = "".join(e.text for e in second if isinstance(e, MessageDelta))
    assert text == "add said: 3; echo said: hi" and second[-1] == Completed("stop")


async def test_without_tools_or_for_unknown_names_it_just_replies() -> None:
    engine = ScriptedEngine()
    for items, tools in (
        ([UserMessage("call add")], ()),
        ([UserMessage("call nothing")], TOOLS),
        ([UserMessage("hello")], TOOLS),
    ):
        events = await stream(engine, items, tools)
        assert not any(isinstance(e, ToolCallCompleted) for e in events)
        assert "".join(e.text for e in events if isinstance(e, MessageDelta)).startswith("You said")


def test_tool_call_script_step() -> None:
    assert tool_call("add", {"a": 1}) == ToolCallCompleted("call_add", "add", '{"a":1}')
    assert tool_call("add", "{broken", id="x") == ToolCallCompleted("x", "add", "{broken")
    assert tool_call("echo").arguments == "{}"
