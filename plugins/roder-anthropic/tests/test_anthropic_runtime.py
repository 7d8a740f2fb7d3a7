"""The ``anthropic`` engine inside the runtime, and ``roder chat`` end to end in a subprocess.

Tests may use roder_runtime; the plugin itself never does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic_helpers import engine_on
from anthropic_loopback import (
    KEY_ENV,
    TEST_KEY,
    LoopbackServer,
    error_reply,
    json_reply,
    message_end,
    message_start,
    sse_reply,
    text_block,
    text_stream,
    thinking_block,
)
from test_anthropic_compaction import SUMMARY, compacted_message

from roder_api import ExtensionRegistryBuilder
from roder_api.testing.loopback import files_contain, roder_env, roder_subprocess
from roder_api.transcript import AssistantMessage, ProviderMetadata, Reasoning, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds=="


def thinking_stream() -> list[dict[str, object]]:
    return [
        message_start(),
        *thinking_block(0, "Seven will do.", SIGNATURE),
        *text_block(1, "7 is ", "prime."),
        *message_end(),
    ]


def runtime_with(engine: object, threads: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)  # type: ignore[arg-type]
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    return Runtime(builder.build(), RuntimeConfig(), owns_registry=True)


@pytest.mark.anyio
async def test_a_thinking_turn_is_persisted_and_replayed_exactly(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect("/v1/messages", sse_reply(thinking_stream()), sse_reply(text_stream()))
    async with runtime_with(engine_on(server, thinking=2048), tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(
            thread_id, "A prime?", engine="anthropic", model="claude-test"
        )
        assert reply == "7 is prime."
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        items = snapshot.items
        # The thinking block (kept) and its text (for display) come before the reply.
        assert [type(i) for i in items][0] is UserMessage
        assert {type(i) for i in items[1:3]} == {Reasoning, ProviderMetadata}
        assert type(items[3]) is AssistantMessage
        again = await runtime.run_turn(thread_id, "More?", engine="anthropic", model="claude-test")
        assert again == "Hello from loopback."
    replayed = server.posted()[1].json()["messages"]
    assert replayed[1]["content"][0] == {
        "type": "thinking",
        "thinking": "Seven will do.",
        "signature": SIGNATURE,
    }
    assert replayed[1]["content"][1] == {"type": "text", "text": "7 is prime."}
    assert not files_contain(tmp_path, TEST_KEY.encode())


# --- end to end: the roder command in a subprocess ---------------------------------------------


roder = roder_subprocess


@pytest.fixture
def home(tmp_path: Path, server: LoopbackServer) -> tuple[Path, dict[str, str]]:
    """Return a RODER_HOME whose config points ``anthropic`` at the loopback server."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        'default_model = "claude-test"\n'
        "[engines.anthropic]\n"
        f'base_url = "{server.base_url}"\n'
        f'api_key_env = "{KEY_ENV}"\n'
        "thinking = 2048\n"
    )
    env = roder_env(home, drop=("ANTHROPIC_API_KEY",), **{KEY_ENV: TEST_KEY})
    return home, env


def test_roder_plugins_lists_the_engine(home: tuple[Path, dict[str, str]]) -> None:
    _, env = home
    listed = roder("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["anthropic"]["engines"] == ["anthropic"]
    assert plugins["anthropic"]["error"] is None


def test_roder_chat_streams_a_reply_from_the_server_and_persists_it(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    root, env = home
    server.expect("/v1/messages", sse_reply(thinking_stream()), sse_reply(text_stream()))
    # Piped stdin is one prompt; -c continues the thread for the second.
    chat = roder("chat", "--engine", "anthropic", env=env, stdin="A prime?\n")
    assert chat.returncode == 0, chat.stderr
    thread_id = chat.stderr.split("thread: ", 1)[1].split()[0]
    assert "7 is prime." in chat.stdout
    assert "Seven will do." in chat.stderr  # reasoning goes to stderr
    then = roder("chat", "--engine", "anthropic", "-c", env=env, stdin="And then?\n")
    assert then.returncode == 0, then.stderr
    assert "Hello from loopback." in then.stdout
    shown = roder("threads", "show", thread_id, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    items = [i for t in json.loads(shown.stdout)["turns"] for i in t["items"]]
    types = [i["type"] for i in items]
    assert sorted(types[1:3]) == ["provider_metadata", "reasoning"]
    assert types[:1] + types[3:] == [
        "user_message",
        "assistant_message",
        "user_message",
        "assistant_message",
    ]
    first, second = server.posted()
    assert first.headers["x-api-key"] == TEST_KEY
    assert second.json()["messages"][1]["content"][0]["signature"] == SIGNATURE
    assert not files_contain(root, TEST_KEY.encode())
    assert TEST_KEY not in chat.stdout + chat.stderr


def test_roder_chat_reports_an_overloaded_server(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    root, env = home
    server.always("/v1/messages", error_reply(529, "overloaded_error", f"Overloaded {TEST_KEY}"))
    (root / "config.toml").write_text(
        (root / "config.toml").read_text() + "[reliability]\nprovider_retry_max_attempts = 1\n"
    )
    chat = roder("chat", "--engine", "anthropic", env=env, stdin="Hello?\n")
    assert chat.returncode == 1
    assert "overloaded" in chat.stderr and "529" in chat.stderr
    assert TEST_KEY not in chat.stdout + chat.stderr


def test_roder_compact_commits_the_boundary_and_the_next_turn_starts_with_it(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    _, env = home
    server.expect("/v1/messages", sse_reply(text_stream("Checklist ready.")))
    first = roder("chat", "--engine", "anthropic", env=env, stdin="Plan the launch.\n")
    assert first.returncode == 0, first.stderr
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    server.expect("/v1/messages", json_reply(compacted_message(SUMMARY)))
    compact = roder("compact", thread_id, "--engine", "anthropic", "--json", env=env)
    assert compact.returncode == 0, compact.stderr
    server.expect("/v1/messages", sse_reply(text_stream("Next step.")))
    again = roder(
        "chat", "--engine", "anthropic", "--thread", thread_id, env=env, stdin="What next?\n"
    )
    assert again.returncode == 0, again.stderr
    messages = server.posted()[-1].json()["messages"]
    assert messages[0] == {
        "role": "assistant",
        "content": [{"type": "compaction", "content": SUMMARY, "signature": "sig-1"}],
    }
    assert messages[1] == {"role": "user", "content": [{"type": "text", "text": "What next?"}]}
