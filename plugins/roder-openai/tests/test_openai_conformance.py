"""Both engines against the engine conformance kit of ``roder_api.testing``, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai_helpers import chat_engine, responses_engine
from openai_loopback import LoopbackServer, json_reply, sse_reply

from roder_api.inference import InferenceEngine, ToolSpec
from roder_api.testing import InferenceEngineConformance

WEATHER = ToolSpec("get_weather", "Weather in a city", {"type": "object"})
TIME = ToolSpec("get_time", "The time in a zone", {"type": "object"})


def tool_round_trip(request: pytest.FixtureRequest) -> bool:
    """Return True in the kit's tool round trip (its fixtures answer with tool calls)."""
    return "tool_round_trip" in request.node.name


class TestOpenAIResponsesConformance(InferenceEngineConformance):
    """The ``openai`` engine, answering from the Responses fixtures."""

    tools = (WEATHER,)

    @pytest.fixture
    async def inference_engine(
        self, server: LoopbackServer, api_key: str, request: pytest.FixtureRequest
    ) -> AsyncIterator[InferenceEngine]:
        if tool_round_trip(request):
            server.expect(
                "/responses",
                sse_reply("responses_tool_call.sse"),
                sse_reply("responses_tool_result.sse"),
            )
        server.always("/responses", sse_reply("responses_reasoning.sse"))
        server.always("/responses/compact", json_reply("compact_success.json"))
        engine = responses_engine(server, models=["gpt-test"])
        try:
            yield engine
        finally:
            await engine.aclose()


class TestOpenAIChatConformance(InferenceEngineConformance):
    """The ``openai-chat`` engine, answering from the Chat Completions fixtures."""

    tools = (WEATHER, TIME)

    @pytest.fixture
    async def inference_engine(
        self, server: LoopbackServer, request: pytest.FixtureRequest
    ) -> AsyncIterator[InferenceEngine]:
        if tool_round_trip(request):
            server.expect("/chat/completions", sse_reply("chat_tool_call.sse"))
        server.always("/chat/completions", sse_reply("chat_text.sse"))
        server.always("/models", json_reply("models.json"))
        engine = chat_engine(server)
        try:
            yield engine
        finally:
            await engine.aclose()
