"""Anthropic's in-turn compaction through the runtime: the streamed ``compaction`` block is
staged with its model step and committed with it only when the step completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from anthropic_helpers import engine_on
from anthropic_loopback import LoopbackServer, sse_reply, text_stream
from test_anthropic_compaction import SUMMARY, in_turn_stream

from roder_api import ExtensionRegistryBuilder
from roder_api.events import CompactionCommitted, CompactionDiscarded
from roder_api.transcript import AssistantMessage, UserMessage, is_compaction_boundary
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


def runtime_with(server: LoopbackServer, threads: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine_on(server, compact_threshold=100000))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    config = RuntimeConfig()
    config.reliability.provider_retry_max_attempts = 1
    return Runtime(builder.build(), config, owns_registry=True)


async def test_a_completed_turn_commits_the_block_and_the_next_turn_starts_with_it(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect("/v1/messages", sse_reply(in_turn_stream()), sse_reply(text_stream("Sure.")))
    async with runtime_with(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, "Next?", engine="anthropic", model="claude-test")
        assert reply == "Based on our conversation so far, here is the next step."
        replay = await runtime.replay_history(thread_id)
        assert is_compaction_boundary(replay[0])
        assert replay[1:] == [AssistantMessage(reply)]
        events = [e.event for e in await (await runtime.store()).read_events(thread_id)]
        assert any(isinstance(e, CompactionCommitted) for e in events)
        await runtime.run_turn(thread_id, "And then?", engine="anthropic", model="claude-test")
    block = {"type": "compaction", "content": SUMMARY, "encrypted_content": "opaque-state-0001"}
    assert server.posted()[1].json()["messages"] == [
        {"role": "assistant", "content": [block, {"type": "text", "text": reply}]},
        {"role": "user", "content": [{"type": "text", "text": "And then?"}]},
    ]


async def test_a_stream_cut_after_the_block_leaves_the_history_as_it_was(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect("/v1/messages", sse_reply(in_turn_stream(), cut_after=6))
    async with runtime_with(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, "Next?", engine="anthropic", model="claude-test")
        assert reply is None
        replay = await runtime.replay_history(thread_id)
        events = [e.event for e in await (await runtime.store()).read_events(thread_id)]
        usage = (await runtime.get_thread(thread_id)).usage
    assert not any(is_compaction_boundary(i) for i in replay)
    assert replay[0] == UserMessage("Next?")
    assert any(isinstance(e, CompactionDiscarded) and e.reason == "disconnected" for e in events)
    assert usage.prompt_tokens > 0  # what message_start reported is billed
