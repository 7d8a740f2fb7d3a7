"""Tool calls on both engines, each request and event checked against the openai SDK's types.

The loopback server speaks the real wire format; here every request body the engines send
is validated with the SDK's request types (``ResponseCreateParamsStreaming``,
``CompletionCreateParamsStreaming``) and every event the server streams with its event
types (``ResponseStreamEvent``, ``ChatCompletionChunk``), so the fixtures and the engines
cannot drift from the API.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_create_params import ResponseCreateParamsStreaming
from openai_helpers import CTX, chat_engine, collect, request, responses_engine, text_of
from openai_loopback import LoopbackServer, sse_events, sse_reply

from roder_api.inference import (
    Completed,
    InferenceEvent,
    ProviderMetadata,
    ToolCallCompleted,
)
from roder_api.tools import tool
from roder_api.transcript import ToolCallRecord, ToolResultRecord, TranscriptItem, UserMessage

pytestmark = pytest.mark.anyio

RESPONSES_REQUEST = pydantic.TypeAdapter(ResponseCreateParamsStreaming)
CHAT_REQUEST = pydantic.TypeAdapter(CompletionCreateParamsStreaming)
RESPONSES_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def _materialize(value: Any) -> Any:
    """Walk a validated TypedDict: the SDK's ``Iterable`` fields validate lazily."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_materialize(v) for v in value]
    if isinstance(value, Iterator):
        return [_materialize(v) for v in value]
    return value


def check_responses_request(body: dict[str, Any]) -> None:
    _materialize(RESPONSES_REQUEST.validate_python(body))


def check_chat_request(body: dict[str, Any]) -> None:
    _materialize(CHAT_REQUEST.validate_python(body))


def check_fixture_events(name: str) -> None:
    for event in sse_events(name):
        data = event.decode().split("data: ", 1)[1].strip()
        if data == "[DONE]":
            continue
        if name.startswith("chat"):
            ChatCompletionChunk.model_validate_json(data)
        else:
            RESPONSES_EVENT.validate_json(data)


@tool
def get_time(zone: str) -> str:
    """The time in a zone.

    Args:
        zone: an IANA zone name
    """
    return "12:00"


@tool
def get_weather(city: str, days: int = 1) -> str:
    """Weather in a city.

    Args:
        city: the city
        days: how many days ahead
    """
    return "sunny"


TOOLS = (get_time.spec(), get_weather.spec())


def journaled(events: list[InferenceEvent]) -> list[TranscriptItem]:
    """Return the items the runtime keeps from a step's events, in its order."""
    items: list[TranscriptItem] = []
    for event in events:
        if isinstance(event, ProviderMetadata):
            items.append(event)
        elif isinstance(event, ToolCallCompleted):
            items.append(ToolCallRecord(event.id, event.name, event.arguments))
    return items


@pytest.mark.parametrize(
    "fixture",
    ["responses_parallel_calls.sse", "responses_tool_call.sse", "responses_tool_result.sse"],
)
def test_tool_fixtures_are_valid_sdk_events(fixture: str) -> None:
    check_fixture_events(fixture)


def test_chat_tool_fixture_is_valid_sdk_chunks() -> None:
    check_fixture_events("chat_tool_call.sse")
    check_fixture_events("chat_text.sse")


async def test_responses_parallel_calls_are_replayed_exactly_with_their_outputs(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect(
        "/responses",
        sse_reply("responses_parallel_calls.sse"),
        sse_reply("responses_tool_result.sse"),
    )
    async with responses_engine(server) as engine:
        first = await collect(engine.stream_turn(CTX, request(UserMessage("?"), tools=TOOLS)))
        calls = [e for e in first if isinstance(e, ToolCallCompleted)]
        assert calls == [
            ToolCallCompleted("call_time_1", "get_time", '{"zone": "UTC"}'),
            ToolCallCompleted("call_weather_2", "get_weather", '{"city": "Oslo"}'),
        ]
        assert first[-1] == Completed("tool_calls", "resp_par_1")
        history: list[TranscriptItem] = [UserMessage("?"), *journaled(first)]
        history += [
            ToolResultRecord("call_time_1", "get_time", "12:00"),
            ToolResultRecord("call_weather_2", "get_weather", "sunny"),
        ]
        second = await collect(engine.stream_turn(CTX, request(*history, tools=TOOLS)))
    assert text_of(second).startswith("It is 21 °C in Paris.")
    bodies = [r.json() for r in server.posted("/responses")]
    for body in bodies:
        check_responses_request(body)
    assert bodies[0]["tools"][1] == {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": get_weather.parameters,
        "strict": False,
    }
    assert bodies[0]["tool_choice"] == "auto"
    assert bodies[1]["input"][1:] == [
        {
            "id": "fc_par_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_time_1",
            "name": "get_time",
            "arguments": '{"zone": "UTC"}',
        },
        {
            "id": "fc_par_2",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_weather_2",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_time_1", "output": "12:00"},
        {"type": "function_call_output", "call_id": "call_weather_2", "output": "sunny"},
    ]


async def test_responses_call_without_its_result_is_not_replayed(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_parallel_calls.sse"))
    server.expect("/responses", sse_reply("responses_tool_result.sse"))
    async with responses_engine(server) as engine:
        first = await collect(engine.stream_turn(CTX, request(UserMessage("?"), tools=TOOLS)))
        history: list[TranscriptItem] = [UserMessage("?"), *journaled(first)]
        history.append(ToolResultRecord("call_time_1", "get_time", "12:00"))
        await collect(engine.stream_turn(CTX, request(*history, tools=TOOLS)))
    body = server.posted("/responses")[1].json()
    check_responses_request(body)
    ids = [item.get("call_id") for item in body["input"] if "call_id" in item]
    assert ids == ["call_time_1", "call_time_1"]


async def test_chat_tool_calls_and_tool_messages_fit_the_sdk_types(
    server: LoopbackServer,
) -> None:
    server.expect("/chat/completions", sse_reply("chat_tool_call.sse"), sse_reply("chat_text.sse"))
    async with chat_engine(server) as engine:
        first = await collect(engine.stream_turn(CTX, request(UserMessage("Oslo?"), tools=TOOLS)))
        calls = [e for e in first if isinstance(e, ToolCallCompleted)]
        assert [c.id for c in calls] == ["call_a", "call_b"]
        history: list[TranscriptItem] = [UserMessage("Oslo?"), *journaled(first)]
        history += [ToolResultRecord(c.id, c.name, f"result of {c.name}") for c in calls]
        await collect(engine.stream_turn(CTX, request(*history, tools=TOOLS)))
    bodies = [r.json() for r in server.posted("/chat/completions")]
    for body in bodies:
        check_chat_request(body)
    assert bodies[0]["tools"][0]["function"]["parameters"] == get_time.parameters
    tool_messages = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "call_a", "content": "result of get_weather"},
        {"role": "tool", "tool_call_id": "call_b", "content": "result of get_time"},
    ]
