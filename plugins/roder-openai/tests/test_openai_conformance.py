"""Both engines against the engine conformance kit (``roder_api.testing``), on the loopback server.

The kit lands with the backends work; until it is in ``roder_api.testing`` this module is
skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai_helpers import chat_engine, responses_engine
from openai_loopback import LoopbackServer, json_reply, sse_reply

import roder_api.testing
from roder_api.inference import InferenceEngine

try:
    InferenceEngineConformance = roder_api.testing.InferenceEngineConformance
except AttributeError:
    pytest.skip(
        "the engine conformance kit is not in roder_api.testing yet", allow_module_level=True
    )


class TestOpenAIResponsesConformance(InferenceEngineConformance):  # type: ignore[misc,valid-type]
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


class TestOpenAIChatConformance(InferenceEngineConformance):  # type: ignore[misc,valid-type]
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
