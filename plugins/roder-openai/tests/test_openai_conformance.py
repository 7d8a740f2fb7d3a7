"""Both engines against the engine conformance kit of ``roder_api.testing``, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai_helpers import chat_engine, responses_engine
from openai_loopback import LoopbackServer, json_reply, sse_reply

from roder_api.inference import InferenceEngine
from roder_api.testing import InferenceEngineConformance


class TestOpenAIResponsesConformance(InferenceEngineConformance):
    """The ``openai`` engine, answering from the Responses fixtures."""

    @pytest.fixture
    async def inference_engine(
        self, server: LoopbackServer, api_key: str
    ) -> AsyncIterator[InferenceEngine]:
        server.always("/responses", sse_reply("responses_reasoning.sse"))
        server.always("/responses/compact", json_reply("compact_success.json"))
        engine = responses_engine(server, models=["gpt-test"])
        try:
            yield engine
        finally:
            await engine.aclose()


class TestOpenAIChatConformance(InferenceEngineConformance):
    """The ``openai-chat`` engine, answering from the Chat Completions fixtures."""

    @pytest.fixture
    async def inference_engine(self, server: LoopbackServer) -> AsyncIterator[InferenceEngine]:
        server.always("/chat/completions", sse_reply("chat_text.sse"))
        server.always("/models", json_reply("models.json"))
        engine = chat_engine(server)
        try:
            yield engine
        finally:
            await engine.aclose()
