"""A 2,048-token model behind ``openai-chat``: the summarising compaction's budget is sized
from the window, so the summary request still holds the conversation."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_helpers import chat_engine
from openai_loopback import LoopbackServer, sse_reply

from roder_api import ExtensionRegistryBuilder
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
