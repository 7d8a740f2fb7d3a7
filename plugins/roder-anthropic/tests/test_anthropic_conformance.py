"""The ``anthropic`` engine against the engine conformance kit of ``roder_api.testing``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic_helpers import engine_on
from anthropic_loopback import (
    LoopbackServer,
    Recorded,
    Reply,
    json_reply,
    message_end,
    message_start,
    sse_reply,
    text_stream,
    tool_block,
)
from test_anthropic_compaction import SUMMARY, compacted_message

from roder_api.inference import InferenceEngine
from roder_api.testing import InferenceEngineConformance


class TestAnthropicConformance(InferenceEngineConformance):
    """The ``anthropic`` engine, answering from the loopback server."""

    @pytest.fixture
    async def inference_engine(
        self, server: LoopbackServer, api_key: str
    ) -> AsyncIterator[InferenceEngine]:
        stream = sse_reply(text_stream())
        compacted = json_reply(compacted_message(SUMMARY))
        calls = sse_reply(
            [message_start(), *tool_block(0, "toolu_kit", "get_time"), *message_end("tool_use")]
        )

        def respond(sent: Recorded) -> Reply:
            # Standalone compactions are not streamed: they get their JSON answer.
            body = sent.json()
            if "compaction" in body:
                return compacted
            # The kit's tool round trip: offered tools and no result yet, call one.
            if body.get("tools") and "tool_result" not in sent.body.decode():
                return calls
            return stream

        server.responder = respond
        engine = engine_on(server, models=["claude-test"])
        try:
            yield engine
        finally:
            await engine.aclose()
