"""The ``openai-chat`` engine against a real loopback server speaking Chat Completions."""

from __future__ import annotations

import pytest
from openai_helpers import (
    CTX,
    chat_engine,
    collect,
    collect_failure,
    reasoning_of,
    request,
    text_of,
)
from openai_loopback import KEY_ENV, LoopbackServer, Reply, json_reply, sse_reply

from roder_api.inference import (
    Completed,
    Failed,
    ProviderFailureKind,
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


async def test_text_turn_with_reasoning_and_final_usage_chunk(server: LoopbackServer) -> None:
    server.expect("/chat/completions", sse_reply("chat_text.sse"))
    async with chat_engine(server) as engine:
        assert not engine.supports_native_compaction
        events = await collect(
            engine.stream_turn(CTX, request(UserMessage("Hi"), instructions="Be kind."))
        )
    assert text_of(events) == "Hi there!" and reasoning_of(events) == "Greeting back."
    assert events[-2:] == [
        Usage(TokenUsage(31, 4, 35, cached_prompt_tokens=16)),
        Completed(stop_reason="stop", provider_response_id="chatcmpl-loop1"),
    ]
    sent = server.requests[0]
    assert sent.path == "/chat/completions" and "authorization" not in sent.headers
    body = sent.json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
    ]


async def test_tool_calls_are_assembled_from_fragments_and_replayed(
    server: LoopbackServer,
) -> None:
    server.expect("/chat/completions", sse_reply("chat_tool_call.sse"), sse_reply("chat_text.sse"))
    tools = (ToolSpec("get_weather"), ToolSpec("get_time"))
    async with chat_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("Oslo?"), tools=tools)))
        assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
            ToolCallCompleted("call_a", "get_weather", '{"city": "Oslo"}'),
            ToolCallCompleted("call_b", "get_time", '{"tz": "CET"}'),
        ]
        assert events[-2:] == [
            Usage(TokenUsage(60, 25, 85)),
            Completed("tool_calls", "chatcmpl-loop2"),
        ]
        history = (
            UserMessage("Oslo?"),
            ToolCallRecord("call_a", "get_weather", '{"city": "Oslo"}'),
            ToolCallRecord("call_b", "get_time", '{"tz": "CET"}'),
            ProviderMetadata({"provider": "someone-else"}),
            ToolResultRecord("call_a", "get_weather", "3 °C"),
            ToolResultRecord("call_b", "get_time", "14:00"),
            AssistantMessage("Cold, at two."),
            UserMessage("Thanks"),
        )
        await collect(engine.stream_turn(CTX, request(*history, tools=tools)))
    first = server.requests[0].json()
    assert first["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    assert server.requests[1].json()["messages"] == [
        {"role": "user", "content": "Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"tz": "CET"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "3 °C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "14:00"},
        {"role": "assistant", "content": "Cold, at two."},
        {"role": "user", "content": "Thanks"},
    ]


async def test_a_stream_without_done_is_interrupted(server: LoopbackServer) -> None:
    server.expect("/chat/completions", sse_reply("chat_cut.sse", cut_after=1))
    server.expect("/chat/completions", sse_reply("chat_cut.sse"))
    async with chat_engine(server) as engine:
        cut_events, cut = await collect_failure(engine.stream_turn(CTX, request()))
        ended_events, ended = await collect_failure(engine.stream_turn(CTX, request()))
    assert text_of(cut_events) == "Cut" and text_of(ended_events) == "Cut short"
    assert cut.kind is ended.kind is ProviderFailureKind.STREAM_INTERRUPTED


async def test_a_length_finish_is_failed_after_usage(server: LoopbackServer) -> None:
    chunks = [
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Trunc"}}]}\n\n',
        b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n',
        b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n',
        b"data: [DONE]\n\n",
    ]

    server.expect("/chat/completions", Reply(chunks=chunks))
    async with chat_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert events[-2] == Usage(TokenUsage(5, 1, 6))
    assert isinstance(events[-1], Failed) and "length" in events[-1].message


async def test_an_error_chunk_is_failed(server: LoopbackServer) -> None:

    chunk = b'data: {"error": {"message": "model not loaded", "code": 503}}\n\n'
    server.expect("/chat/completions", Reply(chunks=[chunk]))
    async with chat_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert events == [Failed("the server reported an error: model not loaded")]


async def test_errors_and_keys_for_a_local_server(server: LoopbackServer, api_key: str) -> None:
    server.expect("/chat/completions", json_reply("error_429.json", 429, {"retry-after": "3"}))
    server.expect("/chat/completions", json_reply("error_context.json", 400))
    server.expect("/chat/completions", json_reply("error_401.json", 401))
    async with chat_engine(server, api_key_env=KEY_ENV) as engine:
        kinds = []
        for _ in range(3):
            _, failure = await collect_failure(engine.stream_turn(CTX, request()))
            kinds.append((failure.kind, failure.retry_after))
    assert kinds == [
        (ProviderFailureKind.RATE_LIMITED, 3.0),
        (ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED, None),
        (ProviderFailureKind.AUTHENTICATION, None),
    ]
    assert all(r.headers["authorization"] == f"Bearer {api_key}" for r in server.requests)


async def test_model_placeholder_uses_the_configured_model(server: LoopbackServer) -> None:
    server.expect("/chat/completions", sse_reply("chat_text.sse"))
    async with chat_engine(server, model="qwen-local") as engine:
        await collect(engine.stream_turn(CTX, request(model="openai-chat-default")))
    assert server.requests[0].json()["model"] == "qwen-local"


async def test_the_chat_connection_is_reused_too(server: LoopbackServer) -> None:
    lingering = sse_reply("chat_text.sse", pause_before_end=0.2)
    server.expect("/chat/completions", lingering, lingering)
    async with chat_engine(server) as engine:
        for _ in range(2):
            stream = engine.stream_turn(CTX, request())
            async for event in stream:
                if isinstance(event, Completed):
                    break
            await stream.aclose()  # type: ignore[attr-defined]
    first, second = server.requests
    assert first.client_port == second.client_port


async def test_tool_calls_without_ids_get_unique_ones(server: LoopbackServer) -> None:
    chunk = (
        b'data: {"id":"c2","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"function":{"name":"ping","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}\n\n'
    )
    reply = Reply(chunks=[chunk, b"data: [DONE]\n\n"])
    server.expect("/chat/completions", reply, reply)
    async with chat_engine(server) as engine:
        first = await collect(engine.stream_turn(CTX, request()))
        second = await collect(engine.stream_turn(CTX, request()))
    calls = [e for e in first + second if isinstance(e, ToolCallCompleted)]
    assert [c.name for c in calls] == ["ping", "ping"]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


async def test_a_refusal_is_the_reply(server: LoopbackServer) -> None:
    chunks = [
        b'data: {"id":"c3","choices":[{"index":0,"delta":{"refusal":"I can\'t help."}}]}\n\n',
        b'data: {"id":"c3","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    server.expect("/chat/completions", Reply(chunks=chunks))
    async with chat_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert text_of(events) == "I can't help." and events[-1] == Completed("stop", "c3")


async def test_the_request_output_cap_is_sent_as_max_tokens(server: LoopbackServer) -> None:
    """``AgentInferenceRequest.max_output_tokens`` goes out as ``max_tokens`` (llama.cpp,
    vLLM, Ollama), the lower of it and the table's cap."""
    server.expect("/chat/completions", sse_reply("chat_text.sse"), sse_reply("chat_text.sse"))
    async with chat_engine(server) as engine:
        await collect(engine.stream_turn(CTX, request(max_output_tokens=33)))
    async with chat_engine(server, max_output_tokens=10) as engine:
        await collect(engine.stream_turn(CTX, request(max_output_tokens=33)))
    first, second = (r.json() for r in server.requests)
    assert first["max_tokens"] == 33
    assert second["max_tokens"] == 10
