"""What a real server showed about the OpenAI engines: output limits, oversized input,
context errors mid-stream, JSON answers to streamed requests, and in-turn compaction."""

from __future__ import annotations

import pytest
from openai_helpers import (
    CTX,
    chat_engine,
    collect,
    collect_failure,
    reasoning_of,
    request,
    responses_engine,
    text_of,
)
from openai_loopback import LoopbackServer, json_reply, sse_reply

from roder_api.inference import (
    Completed,
    ProviderFailureKind,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    UserMessage,
    is_compaction_boundary,
)
from roder_openai import EngineSettings, OpenAISettingsError, responses_input

pytestmark = pytest.mark.anyio

MODELS = {"gpt-test": {"context_window": 2048, "max_output_tokens": 256}, "gpt-big": {}}


# --- max_output_tokens -------------------------------------------------------------------


async def test_responses_sends_the_models_max_output_tokens(
    server: LoopbackServer, api_key: str
) -> None:
    server.always("/responses", sse_reply("responses_text.sse"))
    async with responses_engine(server, models=MODELS) as engine:
        await collect(engine.stream_turn(CTX, request()))
        await collect(engine.stream_turn(CTX, request(model="gpt-big")))
    first, second = (r.json() for r in server.posted("/responses"))
    assert first["max_output_tokens"] == 256
    assert "max_output_tokens" not in second  # no limit configured: the server's default


async def test_chat_sends_the_models_max_tokens(server: LoopbackServer) -> None:
    server.always("/chat/completions", sse_reply("chat_text.sse"))
    async with chat_engine(server, models=MODELS) as engine:
        await collect(engine.stream_turn(CTX, request()))
    assert server.posted("/chat/completions")[0].json()["max_tokens"] == 256


# --- input larger than the context window ------------------------------------------------


@pytest.mark.parametrize("kind", ["responses", "chat"])
async def test_a_message_larger_than_the_window_is_refused_before_sending(
    server: LoopbackServer, api_key: str, kind: str
) -> None:
    big = "word " * 4000  # about 5,000 tokens for a 2,048-token window
    make = responses_engine if kind == "responses" else chat_engine
    async with make(server, models=MODELS) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request(UserMessage(big))))
    assert failure.kind is ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED
    assert not failure.retryable
    assert "2048" in failure.message and "5000" in failure.message
    assert server.requests == []


async def test_a_message_that_fits_is_sent(server: LoopbackServer, api_key: str) -> None:
    server.expect("/responses", sse_reply("responses_text.sse"))
    async with responses_engine(server, models=MODELS) as engine:
        events = await collect(engine.stream_turn(CTX, request(UserMessage("word " * 300))))
    assert isinstance(events[-1], Completed)


# --- context errors ----------------------------------------------------------------------


async def test_response_failed_with_context_length_exceeded_is_a_context_failure(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_failed_context.sse"))
    async with responses_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED
    assert "context window" in failure.message


async def test_a_local_servers_context_error_is_a_context_failure(server: LoopbackServer) -> None:
    server.expect("/chat/completions", json_reply("chat_context_error.json", 400))
    async with chat_engine(server) as engine:
        _, failure = await collect_failure(engine.stream_turn(CTX, request()))
    assert failure.kind is ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED


# --- JSON answers to streamed requests ---------------------------------------------------


async def test_responses_reads_a_json_answer_as_the_response(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", json_reply("responses_whole.json"))
    async with responses_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert text_of(events) == "Checking the weather."
    assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
        ToolCallCompleted("call_json_1", "get_weather", '{"city":"Paris"}')
    ]
    assert sum((e.usage for e in events if isinstance(e, Usage)), TokenUsage()).total_tokens == 42
    assert isinstance(events[-1], Completed)
    assert events[-1].provider_response_id == "resp_json_1"


async def test_chat_reads_a_json_answer_as_the_completion(server: LoopbackServer) -> None:
    server.expect("/chat/completions", json_reply("chat_whole.json"))
    async with chat_engine(server) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    assert text_of(events) == "Checking the weather."
    assert reasoning_of(events) == "The user wants weather."
    assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
        ToolCallCompleted("call_json_1", "get_weather", '{"city":"Paris"}')
    ]
    usage = sum((e.usage for e in events if isinstance(e, Usage)), TokenUsage())
    assert (usage.total_tokens, usage.cached_prompt_tokens) == (42, 4)
    assert isinstance(events[-1], Completed) and events[-1].stop_reason == "tool_calls"


# --- in-turn compaction ------------------------------------------------------------------


async def test_compact_threshold_sends_context_management_and_yields_the_boundary(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_compaction.sse"))
    async with responses_engine(server, compact_threshold=200000) as engine:
        events = await collect(engine.stream_turn(CTX, request()))
    body = server.posted("/responses")[0].json()
    assert body["context_management"] == [{"type": "compaction", "compact_threshold": 200000}]
    boundaries = [e for e in events if isinstance(e, ProviderMetadata)]
    assert len(boundaries) == 1 and is_compaction_boundary(boundaries[0])
    item = {
        "id": "cmp_inturn_1",
        "type": "compaction",
        "encrypted_content": "gAAAAB-in-turn-compacted-state-0001",
    }
    assert boundaries[0].data["output"] == [item]
    assert boundaries[0].data["compacted_input"] == [item]
    assert events.index(boundaries[0]) < next(
        i for i, e in enumerate(events) if type(e).__name__ == "MessageDelta"
    )
    assert text_of(events) == "Picking up where we were."
    # Replay after the boundary: the compaction item first, then what came after it.
    transcript = [
        UserMessage("old"),
        AssistantMessage("older answer"),
        UserMessage("Go on"),
        boundaries[0],
        AssistantMessage(text_of(events)),
        UserMessage("Next"),
    ]
    replayed = responses_input(transcript)
    assert replayed[0] == item
    assert [entry.get("role") for entry in replayed[1:]] == ["assistant", "user"]


async def test_auto_threshold_is_from_the_context_window(
    server: LoopbackServer, api_key: str
) -> None:
    server.always("/responses", sse_reply("responses_text.sse"))
    models = {"gpt-test": {"context_window": 400000}, "gpt-unknown": {}}
    async with responses_engine(server, compact_threshold="auto", models=models) as engine:
        await collect(engine.stream_turn(CTX, request()))
        await collect(engine.stream_turn(CTX, request(model="gpt-unknown")))
    first, second = (r.json() for r in server.posted("/responses"))
    assert first["context_management"] == [{"type": "compaction", "compact_threshold": 320000}]
    assert "context_management" not in second  # no window known: nothing to compute from


async def test_without_a_threshold_no_context_management_is_sent(
    server: LoopbackServer, api_key: str
) -> None:
    server.expect("/responses", sse_reply("responses_text.sse"))
    async with responses_engine(server) as engine:
        await collect(engine.stream_turn(CTX, request()))
    assert "context_management" not in server.posted("/responses")[0].json()


def test_a_bad_threshold_names_the_key() -> None:
    with pytest.raises(OpenAISettingsError, match="compact_threshold"):
        EngineSettings.from_table("openai", {"compact_threshold": "often"})
