"""A second real llm plugin: llm's OpenAI plugin, on a loopback Chat Completions server.

llm reaches any OpenAI-compatible server through ``extra-openai-models.yaml``; here that is
a loopback server speaking the real wire format, so the openai SDK inside llm sends real
HTTP and its own errors come back through the engine.
"""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_api.testing.loopback import (
    TURN_CTX,
    LoopbackServer,
    Recorded,
    Reply,
    collect,
    running_server,
)
from roder_api.transcript import ToolCallRecord, ToolResultRecord, UserMessage
from roder_llm import LlmEngine

pytestmark = [
    pytest.mark.anyio,
    # llm's OpenAI plugin makes an SDK client per prompt and never closes it; the sockets
    # it leaves are llm's (the engine cannot reach them), so their warnings are not errors.
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def collect_llms_leftover_clients() -> Iterator[None]:
    """Collect the SDK clients llm's OpenAI plugin leaves behind, here, with their warnings
    ignored: collected later they would warn inside some other test."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "loop-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


USAGE = (
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "loop-model",
            "choices": [],
            "usage": {
                "prompt_tokens": 11,
                "completion_tokens": 3,
                "total_tokens": 14,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        }
    ).encode()
    + b"\n\n"
)
SSE = {"content-type": "text/event-stream"}


def text_reply(*parts: str) -> Reply:
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in parts]
    chunks += [chunk({}, "stop"), USAGE, b"data: [DONE]\n\n"]
    return Reply(headers=SSE, chunks=chunks)


def tool_reply() -> Reply:
    call = {"index": 0, "id": "call_1", "type": "function"}
    chunks = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [{**call, "function": {"name": "lookup", "arguments": '{"word"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "x"}'}}]}),
        chunk({}, "tool_calls"),
        USAGE,
        b"data: [DONE]\n\n",
    ]
    return Reply(headers=SSE, chunks=chunks)


@pytest.fixture
def server(llm_home: Path) -> Iterator[LoopbackServer]:
    loop = LoopbackServer(prefix="/v1")
    for result in running_server(loop):
        (llm_home / "extra-openai-models.yaml").write_text(
            f"- model_id: loopback-chat\n  model_name: loop-model\n"
            f"  api_base: {loop.base_url}\n  supports_tools: true\n"
        )
        yield result


async def test_streams_text_and_usage_over_real_http(server: LoopbackServer) -> None:
    server.expect("/chat/completions", text_reply("Hel", "lo"))
    events = await collect(
        LlmEngine().stream_turn(
            TURN_CTX, AgentInferenceRequest("loopback-chat", "be brief", [UserMessage("hi")])
        )
    )
    assert "".join(e.text for e in events if isinstance(e, MessageDelta)) == "Hello"
    (usage,) = [e.usage for e in events if isinstance(e, Usage)]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens) == (11, 3, 8)
    assert isinstance(events[-1], Completed)
    sent = server.requests[0].json()
    assert sent["model"] == "loop-model" and sent["stream"] is True
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


async def test_tools_go_out_and_calls_and_results_come_back(server: LoopbackServer) -> None:
    server.expect("/chat/completions", tool_reply())
    tools = [
        ToolSpec(
            "lookup",
            "Look a word up.",
            {"type": "object", "properties": {"word": {"type": "string"}}},
        )
    ]
    engine = LlmEngine()
    first = await collect(
        engine.stream_turn(
            TURN_CTX, AgentInferenceRequest("loopback-chat", None, [UserMessage("x?")], tools)
        )
    )
    (call,) = [e for e in first if isinstance(e, ToolCallCompleted)]
    assert (call.id, call.name, json.loads(call.arguments)) == ("call_1", "lookup", {"word": "x"})
    assert server.requests[0].json()["tools"][0]["function"]["name"] == "lookup"
    server.expect("/chat/completions", text_reply("ten"))
    history = [
        UserMessage("x?"),
        ToolCallRecord(call.id, call.name, call.arguments),
        ToolResultRecord(call.id, call.name, "x means ten"),
    ]
    second = await collect(
        engine.stream_turn(TURN_CTX, AgentInferenceRequest("loopback-chat", None, history, tools))
    )
    assert isinstance(second[-1], Completed)
    messages = server.requests[1].json()["messages"]
    assert messages[1]["role"] == "assistant" and messages[1]["tool_calls"][0]["id"] == "call_1"
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "x means ten"}


async def test_an_http_error_of_the_sdk_is_a_typed_failure(server: LoopbackServer) -> None:
    def refuse(sent: Recorded) -> Reply:
        body = {"error": {"message": "bad key", "type": "invalid_request_error"}}
        return Reply(
            status=401,
            headers={"content-type": "application/json"},
            chunks=[json.dumps(body).encode()],
            chunked=False,
        )

    server.responder = refuse
    with pytest.raises(ProviderFailure) as raised:
        await collect(
            LlmEngine().stream_turn(
                TURN_CTX, AgentInferenceRequest("loopback-chat", None, [UserMessage("hi")])
            )
        )
    assert raised.value.kind is ProviderFailureKind.AUTHENTICATION
    assert "HTTP 401" in raised.value.message


async def test_keys_stay_in_llms_key_store(server: LoopbackServer, llm_home: Path) -> None:
    from roder_api import ExtensionRegistryBuilder
    from roder_api.testing.loopback import files_contain
    from roder_jsonl_thread_store import JsonlThreadStoreFactory
    from roder_runtime import Runtime, RuntimeConfig

    key = "sk-roder-llm-test-key-7f3a"
    (llm_home / "keys.json").write_text(json.dumps({"loopkey": key}))
    extra = (llm_home / "extra-openai-models.yaml").read_text()
    (llm_home / "extra-openai-models.yaml").write_text(extra + "  api_key_name: loopkey\n")
    server.expect("/chat/completions", text_reply("fine"))
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(LlmEngine())
    store = llm_home.parent / "threads"
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=store))
    config = RuntimeConfig(default_engine="llm", default_model="loopback-chat")
    async with Runtime(builder.build(), config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "hi") == "fine"
    # The key went to the server, from llm's key store, and nowhere into Roder's files.
    assert server.requests[0].headers["authorization"] == f"Bearer {key}"
    assert not files_contain(store, key.encode())
