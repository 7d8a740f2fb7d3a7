"""The ``llm`` engine against real llm plugins: llm-echo, and a model of the test's own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import llm
import pytest

from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)
from roder_llm import LlmEngine, LlmSettings, LlmSettingsError, token_usage

pytestmark = pytest.mark.anyio

CONTEXT = InferenceTurnContext(thread_id="thread_t", turn_id="turn_t", model_step_id="step_1")


async def run(engine: LlmEngine, request: AgentInferenceRequest) -> list[InferenceEvent]:
    stream = engine.stream_turn(CONTEXT, request)
    return [event async for event in stream]


def reply(events: list[InferenceEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, MessageDelta))


class ChainModel(llm.Model):
    """A sync llm model that answers with the chain it was given (roles and texts), as JSON."""

    model_id = "roder-test-chain"
    can_stream = True
    supports_tools = True

    def execute(self, prompt: Any, stream: bool, response: Any, conversation: Any = None) -> Any:
        chain = [
            {"role": m.role, "parts": [type(p).__name__ for p in m.parts]} for m in prompt.messages
        ]
        response.set_usage(input=100, output=5, details={"cache_read_input_tokens": 40})
        text = json.dumps(chain)
        yield text[: len(text) // 2]
        yield text[len(text) // 2 :]


class RateLimited(Exception):
    """What a provider SDK raises for HTTP 429 (a status and the response's headers)."""

    def __init__(self) -> None:
        super().__init__("slow down")
        self.status_code = 429
        self.response = type("R", (), {"headers": {"retry-after": "7"}})()


class Broken(llm.Model):
    """A sync llm model whose provider answers HTTP 429 with Retry-After after one chunk."""

    model_id = "roder-test-broken"
    can_stream = True

    def execute(self, prompt: Any, stream: bool, response: Any, conversation: Any = None) -> Any:
        yield "partial "
        raise RateLimited()


class AsyncBroken(llm.AsyncModel):
    """The async twin of :class:`Broken`."""

    model_id = "roder-test-broken"
    can_stream = True

    async def execute(
        self, prompt: Any, stream: bool, response: Any, conversation: Any = None
    ) -> AsyncIterator[str]:
        yield "partial "
        raise RateLimited()


@pytest.fixture
def test_models() -> Iterator[None]:
    """Register the test's own llm models through llm's plugin manager (a real llm plugin)."""
    module = ModuleType("roder_llm_test_models")

    @llm.hookimpl
    def register_models(register: Any) -> None:
        register(ChainModel())
        register(Broken(), AsyncBroken())

    module.register_models = register_models  # type: ignore[attr-defined]
    llm.plugins.pm.register(module, name="roder_llm_test_models")
    try:
        yield
    finally:
        llm.plugins.pm.unregister(name="roder_llm_test_models")


async def test_streams_the_echo_reply_with_its_system_prompt_and_usage() -> None:
    engine = LlmEngine()
    request = AgentInferenceRequest("echo", "be brief", [UserMessage("hello there")])
    events = await run(engine, request)
    answer = json.loads(reply(events))
    assert answer["prompt"] == "hello there" and answer["system"] == "be brief"
    (usage,) = [e for e in events if isinstance(e, Usage)]
    # llm-echo counts words: "hello there" + "be brief" in, its JSON reply out.
    assert usage.usage.prompt_tokens == 4
    assert usage.usage.completion_tokens == len(reply(events).split())
    assert usage.usage.total_tokens == usage.usage.prompt_tokens + usage.usage.completion_tokens
    assert isinstance(events[-1], Completed) and events[-1].stop_reason == "stop"


async def test_tool_calls_come_back_and_results_reach_the_model() -> None:
    engine = LlmEngine()
    tools = [ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {}})]
    ask = json.dumps(
        {"prompt": "find it", "tool_calls": [{"name": "lookup", "arguments": {"q": "x"}}]}
    )
    first = await run(engine, AgentInferenceRequest("echo", None, [UserMessage(ask)], tools))
    (call,) = [e for e in first if isinstance(e, ToolCallCompleted)]
    assert call.name == "lookup" and json.loads(call.arguments) == {"q": "x"}
    assert isinstance(first[-1], Completed) and first[-1].stop_reason == "tool_calls"
    history: list[TranscriptItem] = [
        UserMessage(ask),
        ToolCallRecord(call.id, call.name, call.arguments),
        ToolResultRecord(call.id, call.name, "x means ten"),
    ]
    second = await run(engine, AgentInferenceRequest("echo", None, history, tools))
    answer = json.loads(reply(second))
    assert answer["tool_results"] == [
        {"name": "lookup", "output": "x means ten", "tool_call_id": call.id}
    ]


async def test_the_history_is_replayed_from_the_transcript(test_models: None) -> None:
    engine = LlmEngine()
    history: list[TranscriptItem] = [
        UserMessage("old question"),
        ContextCompaction("we talked about ducks"),
        UserMessage("first"),
        AssistantMessage("answer one"),
        ToolCallRecord("c1", "lookup", '{"q": 1}'),
        ToolCallRecord("c_unanswered", "lookup", "{}"),
        ToolResultRecord("c1", "lookup", "one"),
        AssistantMessage("answer two"),
        UserMessage("second"),
    ]
    events = await run(engine, AgentInferenceRequest("roder-test-chain", None, history))
    chain = json.loads(reply(events))
    # Replay starts at the summary (a user message); the unpaired call is left out; the
    # trailing user message is the prompt, folded in last by llm.
    assert chain == [
        {"role": "user", "parts": ["TextPart"]},
        {"role": "user", "parts": ["TextPart"]},
        {"role": "assistant", "parts": ["TextPart", "ToolCallPart"]},
        {"role": "tool", "parts": ["ToolResultPart"]},
        {"role": "assistant", "parts": ["TextPart"]},
        {"role": "user", "parts": ["TextPart"]},
    ]
    (usage,) = [e for e in events if isinstance(e, Usage)]
    # Anthropic-style cache reads are not in llm's input count; Roder's prompt_tokens has them.
    assert usage.usage.prompt_tokens == 140 and usage.usage.cached_prompt_tokens == 40


async def test_a_rate_limit_is_a_retryable_failure_with_retry_after(test_models: None) -> None:
    # asyncio: the async model on the loop; trio: the sync model in a worker thread.
    engine = LlmEngine()
    with pytest.raises(ProviderFailure) as raised:
        await run(engine, AgentInferenceRequest("roder-test-broken", None, [UserMessage("hi")]))
    assert raised.value.kind is ProviderFailureKind.RATE_LIMITED and raised.value.retryable
    assert raised.value.retry_after == 7
    assert "HTTP 429" in raised.value.message


async def test_unknown_model_and_missing_key_are_typed_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LlmEngine()
    with pytest.raises(ProviderFailure) as unknown:
        await run(engine, AgentInferenceRequest("no-such-model", None, [UserMessage("hi")]))
    assert unknown.value.kind is ProviderFailureKind.INVALID_REQUEST
    assert "roder models --engine llm" in unknown.value.message
    with pytest.raises(ProviderFailure) as keyless:
        await run(engine, AgentInferenceRequest("echo-needs-key", None, [UserMessage("hi")]))
    assert keyless.value.kind is ProviderFailureKind.AUTHENTICATION
    assert not keyless.value.retryable
    monkeypatch.setenv("LLM_ECHO_NEEDS_KEY_KEY", "sk-from-llm-env")
    answer = json.loads(
        reply(await run(engine, AgentInferenceRequest("echo-needs-key", None, [UserMessage("hi")])))
    )
    assert answer["key"] == "sk-from-llm-env"


async def test_keys_come_from_llms_own_key_store(llm_home: Path) -> None:
    (llm_home / "keys.json").write_text(json.dumps({"echo-needs-key": "sk-from-keys-json"}))
    engine = LlmEngine()
    events = await run(engine, AgentInferenceRequest("echo-needs-key", None, [UserMessage("hi")]))
    assert json.loads(reply(events))["key"] == "sk-from-keys-json"


async def test_closing_the_stream_early_is_clean_and_the_engine_still_works() -> None:
    engine = LlmEngine()
    stream = engine.stream_turn(CONTEXT, AgentInferenceRequest("echo", None, [UserMessage("a")]))
    first = await stream.__anext__()
    assert isinstance(first, MessageDelta)
    await stream.aclose()  # type: ignore[attr-defined]
    events = await run(engine, AgentInferenceRequest("echo", None, [UserMessage("b")]))
    assert json.loads(reply(events))["prompt"] == "b"


async def test_tools_offered_to_a_model_without_tools_are_refused(test_models: None) -> None:
    tools = [ToolSpec("lookup", "", {"type": "object"})]
    with pytest.raises(ProviderFailure) as raised:
        await run(
            LlmEngine(),
            AgentInferenceRequest("roder-test-broken", None, [UserMessage("hi")], tools),
        )
    assert raised.value.kind is ProviderFailureKind.INVALID_REQUEST
    assert "does not support tools" in raised.value.message


async def test_models_are_listed_from_the_installed_llm_plugins(test_models: None) -> None:
    from roder_api.inference import InferenceProviderContext

    models = await LlmEngine(LlmSettings(model="echo")).list_models(InferenceProviderContext())
    ids = [m.id for m in models]
    assert ids[0] == "echo" and "roder-test-chain" in ids and "roder-test-broken" in ids


def test_settings_name_the_key_that_is_wrong() -> None:
    assert LlmSettings.from_table("llm", {"model": "echo", "options": {"x": 1}}).options == {"x": 1}
    with pytest.raises(LlmSettingsError, match=r"\[engines.llm\] modle: unknown key"):
        LlmSettings.from_table("llm", {"modle": "echo"})
    with pytest.raises(LlmSettingsError, match="options"):
        LlmSettings.from_table("llm", {"options": 3})


def test_usage_rules() -> None:
    openai_style = token_usage(10, 2, {"prompt_tokens_details": {"cached_tokens": 4}})
    assert (openai_style.prompt_tokens, openai_style.cached_prompt_tokens) == (10, 4)
    anthropic_style = token_usage(10, 2, {"cache_creation_input_tokens": 5})
    assert anthropic_style.prompt_tokens == 15 and anthropic_style.cache_creation_prompt_tokens == 5
    assert token_usage(None, None, None).total_tokens == 0


def test_registering_the_engine_does_not_import_llm() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, roder_llm.plugin\n"
        "from roder_llm import LlmEngine, LlmSettings\n"
        "LlmEngine(LlmSettings(model='echo')).default_model\n"
        "assert 'llm' not in sys.modules, 'llm was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
