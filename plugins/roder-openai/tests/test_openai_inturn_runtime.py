"""OpenAI in-turn compaction through the runtime: the streamed ``compaction`` item commits
with its step, and the next request starts with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai_helpers import responses_engine
from openai_loopback import LoopbackServer, sse_reply

from roder_api import ExtensionRegistryBuilder
from roder_api.events import CompactionCommitted
from roder_api.transcript import AssistantMessage, is_compaction_boundary
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


async def test_the_compaction_item_commits_with_its_step(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect(
        "/responses", sse_reply("responses_compaction.sse"), sse_reply("responses_text.sse")
    )
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(responses_engine(server, compact_threshold=200000))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    async with Runtime(builder.build(), RuntimeConfig(), owns_registry=True) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, "Go on", engine="openai", model="gpt-test")
        assert reply == "Picking up where we were."
        replay = await runtime.replay_history(thread_id)
        assert is_compaction_boundary(replay[0]) and replay[1:] == [AssistantMessage(reply)]
        events = [e.event for e in await (await runtime.store()).read_events(thread_id)]
        assert any(isinstance(e, CompactionCommitted) for e in events)
        await runtime.run_turn(thread_id, "Next", engine="openai", model="gpt-test")
    sent = server.posted("/responses")[1].json()["input"]
    assert sent[0] == {
        "id": "cmp_inturn_1",
        "type": "compaction",
        "encrypted_content": "gAAAAB-in-turn-compacted-state-0001",
    }
    assert [entry.get("role") for entry in sent[1:]] == ["assistant", "user"]
