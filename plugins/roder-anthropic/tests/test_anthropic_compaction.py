"""Anthropic's native compaction: in-turn (``context_management``) and standalone."""

from __future__ import annotations

import pytest
from anthropic_helpers import (
    COMPACT_CTX,
    CTX,
    collect,
    collect_failure,
    engine_on,
    request,
    text_of,
)
from anthropic_loopback import (
    LoopbackServer,
    compaction_block,
    json_reply,
    message_end,
    message_start,
    sse_reply,
    text_block,
    text_stream,
)

from roder_anthropic import IN_TURN_COMPACTION_BETA, STANDALONE_COMPACTION_BETA, anthropic_messages
from roder_api.inference import Completed, ProviderFailureKind, TokenUsage, Usage
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    ToolCallRecord,
    UserMessage,
    is_compaction_boundary,
)

pytestmark = pytest.mark.anyio

SUMMARY = "<summary>The user is building a web scraper in Python.</summary>"


def in_turn_stream() -> list[dict[str, object]]:
    iterations = [
        {
            "type": "compaction",
            "input_tokens": 180000,
            "output_tokens": 3500,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
        {
            "type": "message",
            "input_tokens": 23000,
            "output_tokens": 1000,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    ]
    return [
        message_start(input_tokens=23000),
        *compaction_block(0, SUMMARY, encrypted_content="opaque-state-0001"),
        *text_block(1, "Based on our conversation so far, ", "here is the next step."),
        *message_end("end_turn", output_tokens=1000, input_tokens=23000, iterations=iterations),
    ]


async def test_in_turn_compaction_is_requested_and_yielded_as_a_boundary(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", sse_reply(in_turn_stream()))
    engine = engine_on(server, compact_threshold=100000, compact_instructions="Keep the code.")
    try:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("Next?"))))
    finally:
        await engine.aclose()
    (sent,) = server.posted()
    assert sent.headers["anthropic-beta"] == IN_TURN_COMPACTION_BETA
    assert sent.json()["context_management"] == {
        "edits": [
            {
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": 100000},
                "instructions": "Keep the code.",
            }
        ]
    }
    boundaries = [e for e in events if isinstance(e, ProviderMetadata)]
    assert len(boundaries) == 1 and is_compaction_boundary(boundaries[0])
    block = {"type": "compaction", "content": SUMMARY, "encrypted_content": "opaque-state-0001"}
    assert boundaries[0].data["output"] == [block]
    assert boundaries[0].data["compacted_input"] == [block]
    # The boundary comes before the reply, as the server streamed it.
    assert events.index(boundaries[0]) < next(
        i for i, e in enumerate(events) if type(e).__name__ == "MessageDelta"
    )
    assert text_of(events) == "Based on our conversation so far, here is the next step."
    assert isinstance(events[-1], Completed)
    # Billed: every iteration, the compaction's included (the top level leaves it out).
    total = sum((e.usage for e in events if isinstance(e, Usage)), TokenUsage())
    assert total.prompt_tokens == 203000 and total.completion_tokens == 4500


async def test_replay_after_an_in_turn_boundary_starts_with_the_block(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", sse_reply(in_turn_stream()))
    engine = engine_on(server, compact_threshold=100000)
    try:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("Next?"))))
    finally:
        await engine.aclose()
    boundary = next(e for e in events if isinstance(e, ProviderMetadata))
    transcript = [
        UserMessage("old question"),
        AssistantMessage("old answer"),
        UserMessage("Next?"),
        boundary,
        AssistantMessage(text_of(events)),
        UserMessage("And then?"),
    ]
    block = boundary.data["output"][0]
    assert anthropic_messages(transcript) == [
        {"role": "assistant", "content": [block, {"type": "text", "text": text_of(events)}]},
        {"role": "user", "content": [{"type": "text", "text": "And then?"}]},
    ]


async def test_auto_threshold_comes_from_the_context_window(
    server: LoopbackServer, api_key: str
) -> None:
    server.always("/v1/messages", sse_reply(text_stream()))
    engine = engine_on(
        server,
        compact_threshold="auto",
        models={
            "claude-test": {"context_window": 1000000},
            "claude-small": {"context_window": 20000},
        },
    )
    try:
        await collect(engine.stream_turn(CTX, request()))
        await collect(engine.stream_turn(CTX, request(model="claude-small")))
    finally:
        await engine.aclose()
    triggers = [r.json()["context_management"]["edits"][0]["trigger"] for r in server.posted()]
    # 80 % of the window, never under the API's minimum of 50,000.
    assert triggers == [
        {"type": "input_tokens", "value": 800000},
        {"type": "input_tokens", "value": 50000},
    ]


async def test_no_threshold_sends_no_context_management(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", sse_reply(text_stream()))
    engine = engine_on(server)
    try:
        await collect(engine.stream_turn(CTX, request()))
    finally:
        await engine.aclose()
    assert "context_management" not in server.posted()[0].json()


def compacted_message(content: str | None) -> dict[str, object]:
    return {
        "id": "msg_compact_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "compaction", "content": content, "signature": "sig-1"}],
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 40,
            "output_tokens": 60,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 0,
        },
    }


async def test_standalone_compaction_uses_the_compaction_parameter(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", json_reply(compacted_message(SUMMARY)))
    engine = engine_on(server)
    history = request(
        UserMessage("Build a scraper"), AssistantMessage("Here it is."), instructions="Be kind."
    )
    try:
        events = await collect(engine.compact_turn(COMPACT_CTX, history))
    finally:
        await engine.aclose()
    (sent,) = server.posted()
    assert sent.headers["anthropic-beta"] == STANDALONE_COMPACTION_BETA
    body = sent.json()
    assert body["compaction"] == {"type": "summarize"}
    assert "stream" not in body and "context_management" not in body
    assert body["system"] == "Be kind."
    boundary, usage, completed = events
    assert isinstance(boundary, ProviderMetadata) and is_compaction_boundary(boundary)
    block = {"type": "compaction", "content": SUMMARY, "signature": "sig-1"}
    assert boundary.data["compacted_input"] == [block]
    assert isinstance(usage, Usage) and usage.usage.prompt_tokens == 1040
    assert isinstance(completed, Completed) and completed.stop_reason == "compaction"


async def test_a_failed_standalone_compaction_yields_no_boundary(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/v1/messages", json_reply(compacted_message(None)))
    engine = engine_on(server)
    try:
        events = await collect(engine.compact_turn(COMPACT_CTX, request()))
    finally:
        await engine.aclose()
    assert not any(isinstance(e, ProviderMetadata) for e in events)
    assert isinstance(events[-1], Completed)


async def test_compacting_a_history_ending_in_an_open_call_is_refused(
    server: LoopbackServer, api_key: str
) -> None:
    engine = engine_on(server)
    try:
        _, failure = await collect_failure(
            engine.compact_turn(
                COMPACT_CTX, request(UserMessage("x"), ToolCallRecord("toolu_1", "t", "{}"))
            )
        )
    finally:
        await engine.aclose()
    assert failure.kind is ProviderFailureKind.INVALID_REQUEST
    assert server.requests == []


def test_other_boundaries_replay_as_readable_text() -> None:
    summary = anthropic_messages([ContextCompaction("we talked"), UserMessage("go on")])
    assert summary == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Summary of the conversation so far:\n\nwe talked"},
                {"type": "text", "text": "go on"},
            ],
        }
    ]
    openai_boundary = ProviderMetadata(
        {
            "provider": "openai",
            "output": [{"type": "compaction", "encrypted_content": "x"}],
            "compacted_input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
                {"type": "compaction", "encrypted_content": "x"},
            ],
        }
    )
    assert anthropic_messages([openai_boundary, UserMessage("more")]) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "more"}],
        }
    ]
