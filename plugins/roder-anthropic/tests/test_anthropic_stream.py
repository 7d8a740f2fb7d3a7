"""The ``anthropic`` engine against the loopback server: text, thinking, tools, usage."""

from __future__ import annotations

import pytest
from anthropic_helpers import CTX, collect, engine_on, reasoning_of, request, text_of
from anthropic_loopback import (
    TEST_KEY,
    LoopbackServer,
    message_end,
    message_start,
    ping,
    redacted_block,
    sse_reply,
    text_block,
    text_stream,
    thinking_block,
    tool_block,
)

from roder_anthropic import ANTHROPIC_VERSION, anthropic_messages
from roder_api.inference import (
    Completed,
    Failed,
    TokenUsage,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
)

pytestmark = pytest.mark.anyio


def total_usage(events: list[object]) -> TokenUsage:
    total = TokenUsage()
    for event in events:
        if isinstance(event, Usage):
            total = total + event.usage
    return total


async def test_text_turn_headers_body_and_usage(server: LoopbackServer, api_key: str) -> None:
    server.expect(
        "/v1/messages", sse_reply(text_stream("Hi", " there", input_tokens=7, read=100, created=20))
    )
    engine = engine_on(server)
    try:
        events = await collect(
            engine.stream_turn(CTX, request(UserMessage("Hello?"), instructions="Be brief."))
        )
    finally:
        await engine.aclose()
    assert text_of(events) == "Hi there"
    assert isinstance(events[-1], Completed)
    assert events[-1].stop_reason == "end_turn"
    assert events[-1].provider_response_id == "msg_loopback_1"
    # input 7 + cache read 100 + cache creation 20: prompt_tokens includes the cached ones.
    assert total_usage(events) == TokenUsage(
        prompt_tokens=127,
        completion_tokens=9,
        total_tokens=136,
        cached_prompt_tokens=100,
        cache_creation_prompt_tokens=20,
    )
    (sent,) = server.posted()
    assert sent.headers["x-api-key"] == TEST_KEY
    assert sent.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "anthropic-beta" not in sent.headers  # no beta feature asked for
    assert "authorization" not in sent.headers
    body = sent.json()
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 8192
    assert body["cache_control"] == {"type": "ephemeral"}
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hello?"}]}]


async def test_usage_from_message_start_is_billed_at_once(
    server: LoopbackServer, api_key: str
) -> None:
    """The input tokens are reported when the stream starts, the rest at the end."""
    server.expect("/v1/messages", sse_reply(text_stream(input_tokens=50, read=10)))
    engine = engine_on(server)
    try:
        stream = engine.stream_turn(CTX, request())
        first = await stream.__anext__()
        rest = [event async for event in stream]
    finally:
        await engine.aclose()
    assert isinstance(first, Usage)
    assert first.usage.prompt_tokens == 60
    assert (first.usage + total_usage(rest)).completion_tokens == 9


async def test_thinking_blocks_are_kept_and_replayed_exactly(
    server: LoopbackServer, api_key: str
) -> None:
    signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds=="
    server.expect(
        "/v1/messages",
        sse_reply(
            [
                message_start(),
                *thinking_block(0, "Let me think about this.", signature),
                *redacted_block(1, "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr"),
                *text_block(2, "The answer is 4."),
                *message_end(),
            ]
        ),
    )
    engine = engine_on(server, thinking=2048)
    try:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("2+2?"))))
    finally:
        await engine.aclose()
    assert reasoning_of(events) == "Let me think about this."
    assert text_of(events) == "The answer is 4."
    kept = [e for e in events if isinstance(e, ProviderMetadata)]
    assert [k.data["block"] for k in kept] == [
        {"type": "thinking", "thinking": "Let me think about this.", "signature": signature},
        {
            "type": "redacted_thinking",
            "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr",
        },
    ]
    assert server.posted()[0].json()["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # The next request replays the blocks byte for byte, in front of the reply.
    transcript = [
        UserMessage("2+2?"),
        *kept,
        AssistantMessage("The answer is 4."),
        UserMessage("x"),
    ]
    messages = anthropic_messages(transcript)
    assert messages[1] == {
        "role": "assistant",
        "content": [
            kept[0].data["block"],
            kept[1].data["block"],
            {"type": "text", "text": "The answer is 4."},
        ],
    }


async def test_thinking_with_nothing_after_it_is_not_replayed() -> None:
    block = ProviderMetadata(
        {"provider": "anthropic", "block": {"type": "thinking", "thinking": "t", "signature": "s"}}
    )
    messages = anthropic_messages([UserMessage("a"), block, UserMessage("b")])
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


async def test_tool_use_streams_into_a_call_and_results_replay(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect(
        "/v1/messages",
        sse_reply(
            [
                message_start(),
                *text_block(0, "Looking it up."),
                ping(),
                *tool_block(1, "toolu_01", "get_weather", '{"city": ', '"Paris"}'),
                *tool_block(2, "toolu_02", "get_time"),
                *message_end("tool_use"),
            ]
        ),
    )
    tools = [
        ToolSpec(
            "get_weather",
            "Weather for a city.",
            {"type": "object", "properties": {"city": {"type": "string"}}},
        ),
        ToolSpec("get_time"),
    ]
    engine = engine_on(server)
    try:
        events = await collect(engine.stream_turn(CTX, request(tools=tools)))
    finally:
        await engine.aclose()
    calls = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert calls == [
        ToolCallCompleted("toolu_01", "get_weather", '{"city": "Paris"}'),
        ToolCallCompleted("toolu_02", "get_time", "{}"),
    ]
    assert isinstance(events[-1], Completed) and events[-1].stop_reason == "tool_use"
    body = server.posted()[0].json()
    assert body["tools"] == [
        {
            "name": "get_weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "description": "Weather for a city.",
        },
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ]
    transcript = [
        UserMessage("Weather?"),
        AssistantMessage("Looking it up."),
        ToolCallRecord("toolu_01", "get_weather", '{"city": "Paris"}'),
        ToolCallRecord("toolu_02", "get_time", "{}"),
        ToolCallRecord("toolu_lost", "get_time", "{}"),  # no result: never sent
        ToolResultRecord("toolu_01", "get_weather", "Sunny"),
        ToolResultRecord("toolu_02", "get_time", "boom", is_error=True),
    ]
    assert anthropic_messages(transcript)[1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking it up."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": "boom",
                    "is_error": True,
                },
            ],
        },
    ]


async def test_a_replayed_tool_turn_passes_the_sdk_check(
    server: LoopbackServer, api_key: str
) -> None:
    """The loopback server checks the whole replayed request against the SDK's types."""
    server.expect("/v1/messages", sse_reply(text_stream("Done.")))
    engine = engine_on(server, thinking="adaptive")
    transcript = request(
        UserMessage("Weather?"),
        ProviderMetadata(
            {
                "provider": "anthropic",
                "block": {"type": "thinking", "thinking": "t", "signature": "s"},
            }
        ),
        ToolCallRecord("toolu_01", "get_weather", '{"city": "Paris"}'),
        ToolResultRecord("toolu_01", "get_weather", "Sunny"),
        tools=[ToolSpec("get_weather")],
    )
    try:
        events = await collect(engine.stream_turn(CTX, transcript))
    finally:
        await engine.aclose()
    assert text_of(events) == "Done."
    assert server.posted()[0].json()["thinking"] == {"type": "adaptive"}


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
async def test_a_cut_off_reply_fails(server: LoopbackServer, api_key: str, reason: str) -> None:
    server.expect(
        "/v1/messages",
        sse_reply([message_start(), *text_block(0, "Partial"), *message_end(reason)]),
    )
    engine = engine_on(server)
    try:
        events = await collect(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert text_of(events) == "Partial"
    assert isinstance(events[-1], Failed) and reason in events[-1].message


async def test_max_tokens_comes_from_the_models_max_output_tokens(
    server: LoopbackServer, api_key: str
) -> None:
    server.always("/v1/messages", sse_reply(text_stream()))
    engine = engine_on(
        server,
        models={"claude-test": {"max_output_tokens": 512}, "claude-other": {}},
        max_tokens=999,
    )
    try:
        await collect(engine.stream_turn(CTX, request()))
        await collect(engine.stream_turn(CTX, request(model="claude-other")))
    finally:
        await engine.aclose()
    assert [r.json()["max_tokens"] for r in server.posted()] == [512, 999]


async def test_the_placeholder_model_uses_the_documented_default(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", sse_reply(text_stream()))
    engine = engine_on(server)
    try:
        await collect(engine.stream_turn(CTX, request(model="anthropic-default")))
    finally:
        await engine.aclose()
    assert server.posted()[0].json()["model"] == "claude-sonnet-4-6"


async def test_the_request_output_cap_lowers_max_tokens(
    server: LoopbackServer, api_key: str
) -> None:
    """``AgentInferenceRequest.max_output_tokens`` (a summarising compaction's cap) lowers
    the ``max_tokens`` sent; it never raises it."""
    server.expect("/v1/messages", sse_reply(text_stream("Hi")), sse_reply(text_stream("Hi")))
    engine = engine_on(server, max_tokens=300)
    try:
        await collect(engine.stream_turn(CTX, request(max_output_tokens=40)))
        await collect(engine.stream_turn(CTX, request(max_output_tokens=4000)))
    finally:
        await engine.aclose()
    first, second = (r.json() for r in server.posted())
    assert first["max_tokens"] == 40
    assert second["max_tokens"] == 300
