"""The ``openai`` engine against a real loopback HTTP server speaking the Responses wire format."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from openai_helpers import (
    COMPACT_CTX,
    CTX,
    collect,
    collect_failure,
    reasoning_of,
    request,
    responses_engine,
    text_of,
)
from openai_loopback import (
    TEST_KEY,
    LoopbackServer,
    Reply,
    fixture_bytes,
    json_reply,
    sse_events,
    sse_reply,
)

from roder_api.inference import (
    Completed,
    Failed,
    InferenceProviderContext,
    ModelDescriptor,
    ProviderFailureKind,
    TokenUsage,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    UserMessage,
    is_compaction_boundary,
)
from roder_openai import EngineSettings, OpenAIResponsesEngine

pytestmark = pytest.mark.anyio


async def test_text_turn_streams_deltas_usage_and_completion(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_text.sse"))
    async with responses_engine(server) as engine:
        events = await collect(
            engine.stream_turn(CTX, request(UserMessage("Hello?"), instructions="Be brief."))
        )
    assert text_of(events) == "Hello from loopback."
    assert [type(e).__name__ for e in events] == ["MessageDelta"] * 3 + ["Usage", "Completed"]
    # input_tokens includes the cached ones; so does prompt_tokens.
    assert events[-2] == Usage(TokenUsage(1200, 20, 1220, cached_prompt_tokens=1024))
    assert events[-1] == Completed(stop_reason="stop", provider_response_id="resp_text_1")
    sent = server.requests[0]
    assert (sent.method, sent.path) == ("POST", "/responses")
    assert sent.headers["authorization"] == f"Bearer {api_key}"
    assert sent.headers["accept"] == "text/event-stream"
    body = sent.json()
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["store"] is False and body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "Be brief."
    assert body["prompt_cache_key"] == CTX.thread_id
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
    ]


async def test_reasoning_turn_keeps_the_done_item_and_replays_it_exactly(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect(
        "/responses", sse_reply("responses_reasoning.sse"), sse_reply("responses_text.sse")
    )
    async with responses_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("A prime?"))))
        assert reasoning_of(events) == (
            "**Weighing the question** The user asks for a prime.\n\nSeven will do."
        )
        assert text_of(events) == "7 is prime."
        kept = [e for e in events if isinstance(e, ProviderMetadata)]
        assert len(kept) == 1 and not is_compaction_boundary(kept[0])
        item = kept[0].data["item"]
        # One source of truth: output_item.done, never the added or completed copies.
        assert item["encrypted_content"] == "gAAAAB-from-output-item-done-c2VjcmV0IHJlYXNvbmluZw=="
        assert events[-2] == Usage(TokenUsage(50, 140, 190, reasoning_tokens=128))
        assert events[-1] == Completed("stop", "resp_reason_1")
        # The runtime stores the metadata as it comes, the texts when the step ends.
        history = (
            UserMessage("A prime?"),
            kept[0],
            Reasoning(reasoning_of(events)),
            AssistantMessage("7 is prime."),
            UserMessage("And another?"),
        )
        await collect(engine.stream_turn(CTX, request(*history)))
    replayed = server.requests[1].json()["input"]
    assert [entry.get("type") for entry in replayed] == [
        "message",
        "reasoning",
        "message",
        "message",
    ]
    assert replayed[1] == item  # byte for byte what the provider sent in output_item.done
    assert replayed[2]["role"] == "assistant"
    assert replayed[2]["content"] == [{"type": "output_text", "text": "7 is prime."}]


async def test_tool_call_round_trip(server: LoopbackServer, api_key: str) -> None:
    server.expect(
        "/responses", sse_reply("responses_tool_call.sse"), sse_reply("responses_tool_result.sse")
    )
    tools = (ToolSpec("get_weather", "Weather in a city", {"type": "object"}),)
    async with responses_engine(server) as engine:
        first = await collect(engine.stream_turn(CTX, request(UserMessage("Paris?"), tools=tools)))
        calls = [e for e in first if isinstance(e, ToolCallCompleted)]
        assert calls == [ToolCallCompleted("call_weather_1", "get_weather", '{"city": "Paris"}')]
        assert first[-1] == Completed("tool_calls", "resp_tool_1")
        reasoning = next(e for e in first if isinstance(e, ProviderMetadata))
        history = (
            UserMessage("Paris?"),
            reasoning,
            ToolCallRecord("call_weather_1", "get_weather", '{"city": "Paris"}'),
            ToolResultRecord("call_weather_1", "get_weather", '{"celsius": 21}'),
        )
        second = await collect(engine.stream_turn(CTX, request(*history, tools=tools)))
    # A raw U+2028 inside the JSON does not split the event (no str.splitlines).
    assert text_of(second) == "It is 21 °C in Paris.\u2028Sunny."
    assert second[-2] == Usage(TokenUsage(120, 9, 129, cached_prompt_tokens=64))
    body = server.requests[0].json()
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object"},
            "strict": False,
        }
    ]
    replayed = server.requests[1].json()["input"]
    assert replayed[1] == {
        "id": "rs_tool_1",
        "type": "reasoning",
        "summary": [],
        "encrypted_content": "gAAAAB-tool-reasoning-done",
    }
    assert replayed[2:] == [
        {
            "type": "function_call",
            "call_id": "call_weather_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_weather_1", "output": '{"celsius": 21}'},
    ]


async def test_native_compaction_yields_the_boundary_and_replay_starts_with_it(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses/compact", json_reply("compact_success.json"))
    server.expect("/responses", sse_reply("responses_text.sse"))
    history = (
        UserMessage("Plan the launch checklist."),
        AssistantMessage("Here is a plan."),
        UserMessage("Add the press list."),
        AssistantMessage("Added."),
    )
    async with responses_engine(server) as engine:
        assert engine.supports_native_compaction
        events = await collect(engine.compact_turn(COMPACT_CTX, request(*history)))
        boundary, usage, done = events
        assert isinstance(boundary, ProviderMetadata) and is_compaction_boundary(boundary)
        returned = json.loads(fixture_bytes("compact_success.json"))["output"]
        assert boundary.data["compacted_input"] == returned  # as returned, in order
        assert boundary.data["output"] == [returned[-1]]
        assert usage == Usage(
            TokenUsage(4200, 300, 4500, cached_prompt_tokens=4000, reasoning_tokens=120)
        )
        assert done == Completed("compacted", "resp_compact_1")
        await collect(engine.stream_turn(CTX, request(boundary, UserMessage("What is next?"))))
    compact_request = server.requests[0]
    assert (compact_request.method, compact_request.path) == ("POST", "/responses/compact")
    sent = compact_request.json()
    assert sent["model"] == "gpt-test" and len(sent["input"]) == 4 and "stream" not in sent
    assert server.requests[1].json()["input"] == [
        *returned,
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What is next?"}],
        },
    ]


async def test_compaction_without_a_compaction_item_yields_no_boundary(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses/compact", json_reply("compact_no_item.json"))
    async with responses_engine(server) as engine:
        events = await collect(engine.compact_turn(COMPACT_CTX, request()))
    assert events == [
        Usage(TokenUsage(900, 5, 905)),
        Completed("no_compaction", "resp_compact_2"),
    ]


async def test_compaction_refuses_a_history_ending_in_an_unanswered_call(
    server: LoopbackServer, api_key: str
) -> None:
    history = (UserMessage("Paris?"), ToolCallRecord("call_1", "get_weather", "{}"))
    async with responses_engine(server) as engine:
        events, failure = await collect_failure(engine.compact_turn(COMPACT_CTX, request(*history)))
    assert events == [] and failure.kind is ProviderFailureKind.INVALID_REQUEST
    assert server.requests == []


async def test_a_stream_cut_mid_way_is_interrupted(server: LoopbackServer, api_key: str) -> None:
    server.expect("/responses", sse_reply("responses_cut.sse", cut_after=2))
    async with responses_engine(server) as engine:
        events, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert text_of(events) == "Half of"
    assert failure.kind is ProviderFailureKind.STREAM_INTERRUPTED and failure.retryable


async def test_a_stream_that_ends_without_a_terminal_event_is_interrupted(
    server: LoopbackServer, api_key: str
) -> None:
    # A close-delimited body that simply stops: no protocol error, just no completion.
    server.expect("/responses", sse_reply("responses_cut.sse", chunked=False, delay=0.01))
    async with responses_engine(server) as engine:
        events, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert text_of(events) == "Half of an answer"
    assert failure.kind is ProviderFailureKind.STREAM_INTERRUPTED
    assert "response.completed" in failure.message


async def test_crlf_line_endings_and_split_chunks_decode_the_same(
    server: LoopbackServer, api_key: str
) -> None:
    raw = b"".join(sse_events("responses_reasoning.sse")).replace(b"\n", b"\r\n")
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)]  # cuts lines and CRLFs apart
    server.expect("/responses", Reply(headers={"content-type": "text/event-stream"}, chunks=pieces))
    server.expect("/responses", sse_reply("responses_reasoning.sse"))
    async with responses_engine(server) as engine:
        split = await collect(engine.stream_turn(CTX, request()))
        whole = await collect(engine.stream_turn(CTX, request()))
    assert split == whole and text_of(split) == "7 is prime."


@pytest.mark.parametrize(
    ("fixture", "message", "usage"),
    [
        ("responses_failed.sse", "server_error", TokenUsage(40, 3, 43)),
        ("responses_incomplete.sse", "max_output_tokens", TokenUsage(10, 16, 26)),
        ("responses_error.sse", "rate_limit_exceeded", None),
    ],
)
async def test_failed_incomplete_and_error_events_end_with_failed(
    server: LoopbackServer, api_key: str, fixture: str, message: str, usage: TokenUsage | None
) -> None:
    server.expect("/responses", sse_reply(fixture))
    async with responses_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert isinstance(events[-1], Failed) and message in events[-1].message
    assert [e for e in events if isinstance(e, Usage)] == ([Usage(usage)] if usage else [])
    assert not any(isinstance(e, Completed) for e in events)


async def test_429_with_retry_after_is_rate_limited(server: LoopbackServer, api_key: str) -> None:
    server.expect(
        "/responses",
        json_reply("error_429.json", 429, {"retry-after": "2"}),
        json_reply("error_429.json", 429, {"retry-after-ms": "1500", "retry-after": "9"}),
    )
    async with responses_engine(server) as engine:
        _, first = await collect_failure(engine.stream_turn(CTX, request()))
        _, second = await collect_failure(engine.stream_turn(CTX, request()))
    assert first.kind is ProviderFailureKind.RATE_LIMITED and first.retry_after == 2.0
    assert "rate_limit_exceeded" in first.message and first.retryable
    assert second.retry_after == 1.5  # retry-after-ms is the finer hint


async def test_401_is_an_authentication_failure_without_the_key(
    server: LoopbackServer, api_key: str
) -> None:
    # A server that echoes the key it was sent, whole and masked, must not leak it.
    echo = (
        b'{"error": {"message": "Incorrect API key provided: '
        + api_key.encode()
        + b'", "code": "invalid_api_key"}}'
    )
    server.expect(
        "/responses",
        json_reply("error_401.json", 401),
        Reply(
            status=403, headers={"content-type": "application/json"}, chunks=[echo], chunked=False
        ),
    )
    async with responses_engine(server) as engine:
        _, masked = await collect_failure(engine.stream_turn(CTX, request()))
        _, echoed = await collect_failure(engine.stream_turn(CTX, request()))
    for failure in (masked, echoed):
        assert failure.kind is ProviderFailureKind.AUTHENTICATION and not failure.retryable
        assert TEST_KEY not in str(failure) and "sk-loop" not in str(failure)
        assert "[redacted]" in str(failure)


@pytest.mark.parametrize(
    ("fixture", "status", "kind"),
    [
        ("error_context.json", 400, ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED),
        ("error_400.json", 400, ProviderFailureKind.INVALID_REQUEST),
        ("error_400.json", 404, ProviderFailureKind.INVALID_REQUEST),
        ("error_503.json", 503, ProviderFailureKind.OVERLOADED),
        ("error_503.json", 500, ProviderFailureKind.OVERLOADED),
    ],
)
async def test_error_statuses_map_to_failure_kinds(
    server: LoopbackServer, api_key: str, fixture: str, status: int, kind: ProviderFailureKind
) -> None:
    server.expect("/responses", json_reply(fixture, status))
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is kind and f"HTTP {status}" in failure.message


async def test_context_length_error_from_compaction(server: LoopbackServer, api_key: str) -> None:
    server.expect("/responses/compact", json_reply("error_context.json", 400))
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.compact_turn(COMPACT_CTX, request()))
    assert failure.kind is ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED


async def test_connect_errors_are_network_failures(api_key: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        settings = {
            "base_url": f"http://127.0.0.1:{port}/v1",
            "api_key_env": "RODER_TEST_OPENAI_KEY",
        }
        async with OpenAIResponsesEngine(EngineSettings.from_table("openai", settings)) as engine:
            _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.NETWORK and failure.retryable


async def test_a_silent_server_times_out(server: LoopbackServer, api_key: str) -> None:
    server.expect("/responses", sse_reply("responses_text.sse", delay=0.5))
    async with responses_engine(server, read_timeout=0.1) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.TIMEOUT and failure.retryable


async def test_list_models_uses_get_models(server: LoopbackServer, api_key: str) -> None:
    server.expect("/models", json_reply("models.json"))
    async with responses_engine(server, context_window=200_000) as engine:
        models = await engine.list_models(InferenceProviderContext())
    assert models == (
        ModelDescriptor("gpt-test", context_window=200_000),
        ModelDescriptor("gpt-test-mini", context_window=200_000),
    )
    assert server.requests[0].method == "GET" and server.requests[0].path == "/models"


async def test_configured_models_need_no_request(server: LoopbackServer) -> None:
    engine = responses_engine(server, models={"gpt-a": {"context_window": 1000}, "gpt-b": {}})
    async with engine:
        models = await engine.list_models(InferenceProviderContext())
    assert models == (ModelDescriptor("gpt-a", context_window=1000), ModelDescriptor("gpt-b"))
    assert server.requests == []


async def test_a_custom_base_url_without_its_own_key_variable_gets_no_key(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    server.expect("/responses", sse_reply("responses_text.sse"))
    engine = OpenAIResponsesEngine(
        EngineSettings.from_table("openai", {"base_url": server.base_url})
    )
    async with engine:
        await collect(engine.stream_turn(CTX, request()))
    assert "authorization" not in server.requests[0].headers
    assert TEST_KEY.encode() not in server.requests[0].body


async def test_a_named_but_unset_key_variable_fails_before_sending(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RODER_TEST_OPENAI_KEY", raising=False)
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.AUTHENTICATION
    assert "RODER_TEST_OPENAI_KEY" in failure.message and server.requests == []


async def test_an_injected_transport_is_used(server: LoopbackServer, api_key: str) -> None:
    server.expect("/responses", sse_reply("responses_text.sse"))

    class CountingTransport(httpx.AsyncHTTPTransport):
        calls = 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            CountingTransport.calls += 1
            return await super().handle_async_request(request)

    settings = EngineSettings.from_table(
        "openai", {"base_url": server.base_url, "api_key_env": "RODER_TEST_OPENAI_KEY"}
    )
    async with OpenAIResponsesEngine(settings, transport=CountingTransport()) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert text_of(events) == "Hello from loopback." and CountingTransport.calls == 1


async def test_closing_the_stream_early_releases_the_connection(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_text.sse", delay=0.02))
    server.expect("/responses", sse_reply("responses_text.sse"))
    async with responses_engine(server) as engine:
        stream = engine.stream_turn(CTX, request())
        first = await stream.__anext__()
        await stream.aclose()  # as the runtime does on an interrupt
        again = await collect(engine.stream_turn(CTX, request()))
    assert text_of([first]) == "Hello" and text_of(again) == "Hello from loopback."


async def test_a_connection_is_reused_when_the_consumer_stops_at_completed(
    server: LoopbackServer, api_key: str
) -> None:
    lingering = sse_reply("responses_text.sse", pause_before_end=0.2)
    server.expect("/responses", lingering, lingering)
    async with responses_engine(server) as engine:
        for _ in range(2):
            stream = engine.stream_turn(CTX, request())
            async for event in stream:  # the runtime stops at the terminal event and closes
                if isinstance(event, Completed):
                    break
            await stream.aclose()  # type: ignore[attr-defined]
    first, second = server.requests
    assert first.client_port == second.client_port


async def test_no_model_chosen_fails_clearly_before_sending(
    server: LoopbackServer, api_key: str
) -> None:
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request(model="openai-default")))
    assert failure.kind is ProviderFailureKind.INVALID_REQUEST
    assert "--model" in failure.message and server.requests == []


async def test_a_json_answer_that_is_not_a_response_is_told_apart(
    server: LoopbackServer, api_key: str
) -> None:
    """A JSON answer is read as the response it stands for; anything else is an error."""
    server.expect("/responses", json_reply("compact_success.json"))
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.OTHER
    assert "not a response" in failure.message and "response.compaction" in failure.message


async def test_the_request_output_cap_is_sent_as_max_output_tokens(
    server: LoopbackServer, api_key: str
) -> None:
    """``AgentInferenceRequest.max_output_tokens`` (a summarising compaction's cap) goes on
    the wire, and never raises the table's own cap."""
    server.expect("/responses", sse_reply("responses_text.sse"), sse_reply("responses_text.sse"))
    async with responses_engine(server, max_output_tokens=64) as engine:
        await collect(engine.stream_turn(CTX, request(max_output_tokens=500)))
        await collect(engine.stream_turn(CTX, request(max_output_tokens=20)))
    first, second = (r.json() for r in server.requests)
    assert first["max_output_tokens"] == 64
    assert second["max_output_tokens"] == 20
