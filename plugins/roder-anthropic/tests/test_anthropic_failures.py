"""Typed failures, the key rules, and answers that are not what was asked for."""

from __future__ import annotations

import json

import pytest
from anthropic_helpers import CTX, collect, collect_failure, engine_on, request, text_of
from anthropic_loopback import (
    TEST_KEY,
    LoopbackServer,
    Reply,
    error_reply,
    json_reply,
    message_start,
    sse_reply,
    text_block,
    text_stream,
)
from anthropic_wire import check_models

from roder_anthropic import AnthropicEngine, AnthropicSettings, AnthropicSettingsError
from roder_api.inference import (
    Completed,
    InferenceProviderContext,
    ProviderFailureKind,
    ToolCallCompleted,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("status", "kind", "message", "headers", "expected", "retry_after"),
    [
        (529, "overloaded_error", "Overloaded", {}, ProviderFailureKind.OVERLOADED, None),
        (
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your rate limit",
            {"retry-after": "7"},
            ProviderFailureKind.RATE_LIMITED,
            7.0,
        ),
        (500, "api_error", "Internal server error", {}, ProviderFailureKind.OVERLOADED, None),
        (
            401,
            "authentication_error",
            "invalid x-api-key",
            {},
            ProviderFailureKind.AUTHENTICATION,
            None,
        ),
        (403, "permission_error", "no access", {}, ProviderFailureKind.AUTHENTICATION, None),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 215000 tokens > 200000 maximum",
            {},
            ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED,
            None,
        ),
        (
            400,
            "invalid_request_error",
            "messages: roles must alternate",
            {},
            ProviderFailureKind.INVALID_REQUEST,
            None,
        ),
        (404, "not_found_error", "no model", {}, ProviderFailureKind.INVALID_REQUEST, None),
    ],
)
async def test_error_answers_are_typed_failures(
    server: LoopbackServer,
    api_key: str,
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str],
    expected: ProviderFailureKind,
    retry_after: float | None,
) -> None:
    server.expect("/v1/messages", error_reply(status, kind, message, **headers))
    engine = engine_on(server)
    try:
        events, failure = await collect_failure(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert events == []
    assert failure.kind is expected
    assert failure.retry_after == retry_after
    assert str(status) in failure.message and kind in failure.message
    assert TEST_KEY not in failure.message


async def test_an_error_event_mid_stream_is_a_typed_failure(
    server: LoopbackServer, api_key: str
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.expect("/v1/messages", sse_reply([message_start(), *text_block(0, "Par")[:2], error]))
    engine = engine_on(server)
    try:
        events, failure = await collect_failure(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert text_of(events) == "Par"  # what came before the error is kept
    assert failure.kind is ProviderFailureKind.OVERLOADED and failure.retryable


async def test_a_cut_stream_is_stream_interrupted(server: LoopbackServer, api_key: str) -> None:
    server.expect("/v1/messages", sse_reply(text_stream("Hello", " world"), cut_after=4))
    engine = engine_on(server)
    try:
        events, failure = await collect_failure(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert text_of(events) == "Hello"
    assert failure.kind is ProviderFailureKind.STREAM_INTERRUPTED


async def test_a_json_answer_to_a_streamed_request_is_read_as_the_message(
    server: LoopbackServer, api_key: str
) -> None:
    message = {
        "id": "msg_json_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"q": "x"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 2},
    }
    server.expect("/v1/messages", json_reply(message))
    engine = engine_on(server)
    try:
        events = await collect(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert text_of(events) == "Calling."
    assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
        ToolCallCompleted("toolu_9", "lookup", '{"q":"x"}')
    ]
    assert isinstance(events[-1], Completed) and events[-1].provider_response_id == "msg_json_1"


async def test_the_key_goes_only_to_the_configured_base_url(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A custom base_url without its own api_key_env gets no key, not ANTHROPIC_API_KEY."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEST_KEY)
    server.expect("/v1/messages", sse_reply(text_stream()))
    settings = AnthropicSettings.from_table("anthropic", {"base_url": server.base_url})
    engine = AnthropicEngine(settings)
    try:
        await collect(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    (sent,) = server.posted()
    assert "x-api-key" not in sent.headers
    assert TEST_KEY not in str(sent.headers)


def test_the_default_base_url_uses_anthropic_api_key() -> None:
    assert AnthropicSettings.from_table("anthropic", None).api_key_env == "ANTHROPIC_API_KEY"
    custom = AnthropicSettings.from_table("anthropic", {"base_url": "http://127.0.0.1:9"})
    assert custom.api_key_env is None


async def test_a_named_but_unset_key_fails_before_sending(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RODER_TEST_ANTHROPIC_KEY", raising=False)
    engine = engine_on(server)
    try:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert failure.kind is ProviderFailureKind.AUTHENTICATION
    assert server.requests == []


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"thinking": 10}, "thinking"),
        ({"compact_threshold": "soon"}, "compact_threshold"),
        ({"models": {"m": {"context": 1}}}, "unknown key 'context'"),
        ({"prompt_cache": "yes"}, "prompt_cache"),
    ],
)
def test_bad_settings_name_the_key(table: dict[str, object], words: str) -> None:
    with pytest.raises(AnthropicSettingsError, match=words):
        AnthropicSettings.from_table("anthropic", table)


async def test_list_models_reads_the_servers_models(server: LoopbackServer, api_key: str) -> None:
    models = {
        "data": [
            {
                "id": "claude-test",
                "type": "model",
                "display_name": "Claude Test",
                "lifecycle": "active",
                "created_at": "2026-01-01T00:00:00Z",
                "max_input_tokens": 1000000,
                "max_tokens": 64000,
            }
        ],
        "has_more": False,
        "first_id": "claude-test",
        "last_id": "claude-test",
    }
    check_models(models)
    server.expect(
        "/v1/models",
        Reply(
            headers={"content-type": "application/json"},
            chunks=[json.dumps(models).encode()],
        ),
    )
    engine = engine_on(server)
    try:
        (model,) = await engine.list_models(InferenceProviderContext())
    finally:
        await engine.aclose()
    assert (model.id, model.context_window, model.max_output_tokens) == (
        "claude-test",
        1000000,
        64000,
    )


async def test_input_that_cannot_fit_the_window_is_refused_before_sending(
    server: LoopbackServer, api_key: str
) -> None:
    from roder_api.transcript import UserMessage

    engine = engine_on(server, models={"claude-test": {"context_window": 2048}})
    big = request(UserMessage("word " * 4000))  # about 5,000 tokens
    try:
        _, failure = await collect_failure(engine.stream_turn(CTX, big))
    finally:
        await engine.aclose()
    assert failure.kind is ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED
    assert "5000" in failure.message and "2048" in failure.message
    assert server.requests == []
