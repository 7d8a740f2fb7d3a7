"""A 2,048-token model behind ``openai-chat``: the summarising compaction's budget is sized
from the window, so the summary request still holds the conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai_helpers import chat_engine
from openai_loopback import LoopbackServer, sse_reply

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import CompactionFailed
from roder_api.events import CompactionCommitted, CompactionDiscarded, DiscardReason
from roder_api.testing.loopback import Reply
from roder_api.transcript import ContextCompaction
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


def small_runtime(server: LoopbackServer, threads: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(chat_engine(server, models={"small": {"context_window": 2048}}))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    config = RuntimeConfig()
    config.compaction.auto_compact_fraction = 0  # compact only when asked, here
    return Runtime(builder.build(), config, owns_registry=True)


async def test_the_summary_request_of_a_small_model_holds_the_reply(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.expect("/chat/completions", sse_reply("chat_text.sse"), sse_reply("chat_text.sse"))
    async with small_runtime(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(
            thread_id, "Plan a picnic for four.", engine="openai-chat", model="small"
        )
        history = await runtime.replay_history(thread_id)
        result = await runtime.compact_with_provider(
            thread_id, "turn_c", "openai-chat", "small", history
        )
    assert isinstance(result.boundary, ContextCompaction)
    summary_request = server.posted("/chat/completions")[1].json()
    roles = [m["role"] for m in summary_request["messages"]]
    # The goal, the model's reply and the request to summarise: nothing was cut to fit a
    # budget of 1 token (the window minus a 2,000-token reserve, clamped).
    assert roles.count("assistant") == 1, summary_request["messages"]
    assert any("Plan a picnic" in str(m["content"]) for m in summary_request["messages"])


def chat_chunks(text: str, completion_tokens: int) -> Reply:
    """Return a streamed Chat Completions reply of ``text`` (a llama.cpp-shaped stream)."""
    base = {"id": "chatcmpl-cap", "object": "chat.completion.chunk", "model": "small"}

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        return (
            b"data: " + json.dumps({**base, "choices": choices, "usage": usage}).encode() + b"\n\n"
        )

    words = [text[i : i + 64] for i in range(0, len(text), 64)]
    chunks = [chunk([{"index": 0, "delta": {"content": w}, "finish_reason": None}]) for w in words]
    chunks.append(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    usage = {"prompt_tokens": 90, "completion_tokens": completion_tokens}
    chunks.append(chunk([], {**usage, "total_tokens": 90 + completion_tokens}))
    chunks.append(b"data: [DONE]\n\n")
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


async def test_the_summarising_call_sends_the_output_cap_on_the_wire(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """The summary is asked for at most a quarter of the window, and the request says so:
    ``max_tokens`` is on the wire (a server that honours it cannot send more)."""
    server.expect("/chat/completions", sse_reply("chat_text.sse"), sse_reply("chat_text.sse"))
    async with small_runtime(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "Plan a picnic.", engine="openai-chat", model="small")
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(thread_id, "turn_c", "openai-chat", "small", history)
    turn_request, summary_request = (r.json() for r in server.posted("/chat/completions"))
    assert "max_tokens" not in turn_request  # a turn keeps the server's default
    assert summary_request["max_tokens"] == 2048 // 4  # min(summary_max_tokens, window / 4)


async def test_a_summary_over_the_cap_is_discarded_never_committed(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """A server that ignores the cap (the SmolLM2 report: ~896 tokens for a 400-token
    window) gets its summary discarded with a reason; the history is unchanged."""
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(chat_engine(server, models={"tiny": {"context_window": 400}}))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    config = RuntimeConfig()
    config.compaction.auto_compact_fraction = 0
    server.expect("/chat/completions", sse_reply("chat_text.sse"), chat_chunks("word " * 720, 896))
    async with Runtime(builder.build(), config, owns_registry=True) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "Plan a picnic.", engine="openai-chat", model="tiny")
        history = await runtime.replay_history(thread_id)
        with pytest.raises(CompactionFailed) as failed:
            await runtime.compact_with_provider(thread_id, "turn_c", "openai-chat", "tiny", history)
        assert failed.value.reason == DiscardReason.TOO_LARGE
        assert "896" in str(failed.value) and "100" in str(failed.value)
        assert await runtime.replay_history(thread_id) == history
        events = (await runtime.event_page(thread_id, limit=1000)).events
        assert not any(isinstance(e.event, CompactionCommitted) for e in events)
        assert isinstance(events[-1].event, CompactionDiscarded)
        assert events[-1].event.reason == DiscardReason.TOO_LARGE
        usage = await runtime.usage_by_purpose(thread_id)
        assert usage["discarded_compaction"].completion_tokens == 896  # billed all the same
    assert server.posted("/chat/completions")[1].json()["max_tokens"] == 100
