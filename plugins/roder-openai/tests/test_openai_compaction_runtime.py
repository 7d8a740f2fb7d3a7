"""Native compaction through the runtime (``Runtime.compact_with_provider``) with the
``openai`` engine on the loopback server: the server's boundary is committed and the next
request starts with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai_helpers import responses_engine
from openai_loopback import LoopbackServer, fixture_bytes, json_reply, sse_reply

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import CompactionFailed
from roder_api.transcript import ProviderMetadata, is_compaction_boundary
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


def make_runtime(server: LoopbackServer, threads: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(responses_engine(server))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    return Runtime(builder.build(), RuntimeConfig(), owns_registry=True)


async def test_a_compaction_commits_the_server_boundary_and_the_next_request_starts_with_it(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect(
        "/responses", sse_reply("responses_reasoning.sse"), sse_reply("responses_text.sse")
    )
    server.expect("/responses/compact", json_reply("compact_success.json"))
    returned = json.loads(fixture_bytes("compact_success.json"))["output"]
    async with make_runtime(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "A prime?", engine="openai", model="gpt-test")
        history = await runtime.replay_history(thread_id)
        result = await runtime.compact_with_provider(
            thread_id, "turn_compact", "openai", "gpt-test", history
        )
        assert isinstance(result.boundary, ProviderMetadata)
        assert result.boundary.data["compacted_input"] == returned
        assert result.usage.total_tokens == 4500
        replay = await runtime.replay_history(thread_id)
        assert len(replay) == 1 and is_compaction_boundary(replay[0])
        reply = await runtime.run_turn(thread_id, "What next?", engine="openai", model="gpt-test")
        assert reply == "Hello from loopback."
    compact_sent = server.posted("/responses/compact")[0].json()["input"]
    assert [e.get("type") for e in compact_sent] == ["message", "reasoning", "message"]
    after = server.posted("/responses")[1].json()["input"]
    assert after[: len(returned)] == returned
    assert after[len(returned) :] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What next?"}],
        }
    ]


async def test_a_compaction_without_a_compaction_item_is_discarded_and_billed(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect("/responses", sse_reply("responses_text.sse"))
    server.expect("/responses/compact", json_reply("compact_no_item.json"))
    async with make_runtime(server, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "Hello?", engine="openai", model="gpt-test")
        before = await runtime.replay_history(thread_id)
        with pytest.raises(CompactionFailed) as raised:
            await runtime.compact_with_provider(thread_id, "turn_c", "openai", "gpt-test", before)
        assert raised.value.reason == "no_boundary"
        assert await runtime.replay_history(thread_id) == before
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None and snapshot.metadata.usage.total_tokens == 1220 + 905
