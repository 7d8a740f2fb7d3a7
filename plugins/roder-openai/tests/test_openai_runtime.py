"""The ``openai`` engines inside the runtime, and ``roder chat`` end to end in a subprocess.

Tests may use roder_runtime; the plugin itself never does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai_helpers import responses_engine
from openai_loopback import (
    KEY_ENV,
    TEST_KEY,
    LoopbackServer,
    Reply,
    fixture_bytes,
    json_reply,
    sse_reply,
)

from roder_api import ExtensionRegistryBuilder
from roder_api.events import ErrorEvent, UsageUpdated
from roder_api.testing.loopback import files_contain, roder_env, roder_subprocess
from roder_api.transcript import AssistantMessage, ProviderMetadata, Reasoning, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_runtime.config._sections import ReliabilityConfig


def runtime_with(engine: object, threads: Path, **reliability: int) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)  # type: ignore[arg-type]
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=threads))
    config = RuntimeConfig(reliability=ReliabilityConfig(**reliability))
    return Runtime(builder.build(), config, owns_registry=True)  # closes the engine too


@pytest.mark.anyio
async def test_a_reasoning_turn_is_persisted_and_replayed_exactly(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect(
        "/responses", sse_reply("responses_reasoning.sse"), sse_reply("responses_text.sse")
    )
    engine = responses_engine(server)
    async with runtime_with(engine, tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, "A prime?", engine="openai", model="gpt-test")
        assert reply == "7 is prime."
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        items = snapshot.items
        assert [type(i).__name__ for i in items] == [
            "UserMessage",
            "ProviderMetadata",
            "Reasoning",
            "AssistantMessage",
        ]
        assert isinstance(items[1], ProviderMetadata) and isinstance(items[2], Reasoning)
        assert snapshot.metadata.usage.total_tokens == 190
        assert snapshot.metadata.usage.reasoning_tokens == 128
        # The response's id, its finish reason and the reasoning tokens reach the journal.
        events = await (await runtime.journal(thread_id)).read_events()
        (billed,) = [e.event for e in events if isinstance(e.event, UsageUpdated)]
        assert (billed.response_id, billed.finish_reason) == ("resp_reason_1", "stop")
        assert billed.usage.reasoning_tokens == 128
        again = await runtime.run_turn(thread_id, "Another?", engine="openai", model="gpt-test")
        assert again == "Hello from loopback."
    replayed = server.posted("/responses")[1].json()["input"]
    assert replayed[1] == dict(items[1].data["item"])
    assert replayed[2]["content"][0]["text"] == "7 is prime."
    assert replayed[3]["content"][0]["text"] == "Another?"
    assert server.posted("/responses")[1].json()["prompt_cache_key"] == thread_id
    assert not files_contain(tmp_path, TEST_KEY.encode())


@pytest.mark.anyio
async def test_the_runtime_retries_a_rate_limited_call(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect(
        "/responses",
        json_reply("error_429.json", 429, {"retry-after": "0"}),
        sse_reply("responses_text.sse"),
    )
    async with runtime_with(
        responses_engine(server),
        tmp_path / "threads",
        provider_retry_max_attempts=2,
        provider_retry_initial_backoff_ms=0,
    ) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, "Hello?", engine="openai", model="gpt-test")
    assert reply == "Hello from loopback." and len(server.posted("/responses")) == 2


@pytest.mark.anyio
async def test_a_cut_stream_fails_the_turn_and_keeps_what_was_billed(
    server: LoopbackServer, api_key: str, tmp_path: Path
) -> None:
    server.expect("/responses", sse_reply("responses_failed.sse"))
    seen: list[object] = []

    async def emit(events: list[object]) -> None:
        seen.extend(events)

    async with runtime_with(responses_engine(server), tmp_path / "threads") as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(
            thread_id,
            "Hello?",
            engine="openai",
            model="gpt-test",
            emit=emit,  # type: ignore[arg-type]
        )
        snapshot = await runtime.load_thread(thread_id)
    assert reply is None and snapshot is not None
    assert snapshot.metadata.usage.total_tokens == 43
    assert any(isinstance(e, UsageUpdated) for e in seen)
    assert any(isinstance(e, ErrorEvent) and "server_error" in e.message for e in seen)
    assert [type(i) for i in snapshot.items] == [UserMessage, AssistantMessage]


# --- end to end: the roder command in a subprocess ---------------------------------------------


roder = roder_subprocess


@pytest.fixture
def home(tmp_path: Path, server: LoopbackServer) -> tuple[Path, dict[str, str]]:
    """Return a RODER_HOME whose config points ``openai`` at the loopback server, and an env."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        'default_model = "gpt-test"\n'
        "[engines.openai]\n"
        f'base_url = "{server.base_url}"\n'
        f'api_key_env = "{KEY_ENV}"\n'
        "[engines.openai-chat]\n"
        f'base_url = "{server.base_url}"\n'
    )
    env = roder_env(home, drop=("OPENAI_API_KEY",), **{KEY_ENV: TEST_KEY})
    return home, env


def test_roder_plugins_lists_both_engines(home: tuple[Path, dict[str, str]]) -> None:
    _, env = home
    listed = roder("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["openai"]["engines"] == ["openai", "openai-chat"]
    assert plugins["openai"]["error"] is None


def test_roder_chat_streams_a_reply_from_the_server_and_persists_it(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    root, env = home
    server.expect(
        "/responses", sse_reply("responses_reasoning.sse"), sse_reply("responses_text.sse")
    )
    # Piped stdin is one prompt; -c continues the thread for the second.
    chat = roder("chat", "--engine", "openai", env=env, stdin="A prime?\n")
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.startswith("thread: ") or "\nthread: " in chat.stderr
    thread_id = chat.stderr.split("thread: ", 1)[1].split()[0]
    assert chat.stdout == "7 is prime.\n"
    assert "Seven will do." in chat.stderr  # reasoning goes to stderr
    then = roder("chat", "--engine", "openai", "-c", env=env, stdin="And then?\n")
    assert then.returncode == 0, then.stderr
    assert "Hello from loopback." in then.stdout
    shown = roder("threads", "show", thread_id, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    items = [i for t in json.loads(shown.stdout)["turns"] for i in t["items"]]
    assert [i["type"] for i in items] == [
        "user_message",
        "provider_metadata",
        "reasoning",
        "assistant_message",
        "user_message",
        "assistant_message",
    ]
    assert items[3]["text"] == "7 is prime."
    # The server got the key; the store and the output never did.
    assert server.posted("/responses")[0].headers["authorization"] == f"Bearer {TEST_KEY}"
    assert server.posted("/responses")[1].json()["input"][1]["id"] == "rs_reason_1"
    assert not files_contain(root, TEST_KEY.encode())
    assert TEST_KEY not in chat.stdout + chat.stderr + then.stdout + then.stderr


def test_roder_chat_reports_a_provider_error_without_the_key(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    root, env = home
    echo = json.dumps({"error": {"message": f"bad key {TEST_KEY}", "code": "invalid_api_key"}})

    server.expect(
        "/responses",
        Reply(
            status=401,
            headers={"content-type": "application/json"},
            chunks=[echo.encode()],
            chunked=False,
        ),
    )
    chat = roder("chat", "--engine", "openai", env=env, stdin="Hello?\n")
    assert chat.returncode == 1
    assert "authentication" in chat.stderr and "HTTP 401" in chat.stderr
    assert TEST_KEY not in chat.stdout + chat.stderr
    assert not files_contain(root, TEST_KEY.encode())


def test_roder_chat_with_a_local_chat_server_sends_no_key(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    _, env = home
    env = {**env, "OPENAI_API_KEY": TEST_KEY}  # set, but never for a custom base_url
    server.expect("/chat/completions", sse_reply("chat_text.sse"))
    chat = roder("chat", "--engine", "openai-chat", env=env, stdin="Hi\n")
    assert chat.returncode == 0, chat.stderr
    assert "Hi there!" in chat.stdout
    assert "authorization" not in server.posted("/chat/completions")[0].headers


def test_roder_compact_commits_the_server_boundary_and_the_next_turn_starts_with_it(
    server: LoopbackServer, home: tuple[Path, dict[str, str]]
) -> None:
    _, env = home
    server.expect("/responses", sse_reply("responses_text.sse"), sse_reply("responses_text.sse"))
    server.expect("/responses/compact", json_reply("compact_success.json"))
    first = roder("chat", "--engine", "openai", env=env, stdin="Plan the launch checklist.\n")
    assert first.returncode == 0, first.stderr
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    compact = roder("compact", thread_id, "--engine", "openai", "--json", env=env)
    assert compact.returncode == 0, compact.stderr
    assert "cmp_loopback_1" in compact.stdout
    again = roder(
        "chat", "--engine", "openai", "--thread", thread_id, env=env, stdin="What next?\n"
    )
    assert again.returncode == 0, again.stderr
    returned = json.loads(fixture_bytes("compact_success.json"))["output"]
    sent = server.posted("/responses")[1].json()["input"]
    assert sent[: len(returned)] == returned
    assert [e["content"][0]["text"] for e in sent[len(returned) :]] == ["What next?"]
    assert server.posted("/responses/compact")[0].json()["input"][0]["content"][0]["text"] == (
        "Plan the launch checklist."
    )
