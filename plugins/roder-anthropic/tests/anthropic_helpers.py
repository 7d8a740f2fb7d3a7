"""Helpers shared by the roder-anthropic tests: an engine on the loopback server, collecting."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from anthropic_loopback import KEY_ENV, LoopbackServer

from roder_anthropic import AnthropicEngine, AnthropicSettings
from roder_api.inference import (
    AgentInferenceRequest,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ReasoningDelta,
)
from roder_api.transcript import TranscriptItem, UserMessage

CTX = InferenceTurnContext("thread_loopback", "turn_1", "step_1")
COMPACT_CTX = InferenceTurnContext("thread_loopback", "turn_2", "step_2", purpose="compaction")


def engine_on(server: LoopbackServer, **table: Any) -> AnthropicEngine:
    """Return an ``anthropic`` engine pointed at the server, with the test key's variable."""
    settings = {"base_url": server.base_url, "api_key_env": KEY_ENV, **table}
    return AnthropicEngine(AnthropicSettings.from_table("anthropic", settings))


def request(*items: TranscriptItem, **kwargs: Any) -> AgentInferenceRequest:
    """Return a request for ``claude-test`` with the given transcript (a greeting by default)."""
    transcript: Sequence[TranscriptItem] = items or (UserMessage("Hello?"),)
    return AgentInferenceRequest(
        model=kwargs.pop("model", "claude-test"),
        instructions=kwargs.pop("instructions", None),
        transcript=tuple(transcript),
        **kwargs,
    )


async def collect(stream: AsyncIterator[InferenceEvent]) -> list[InferenceEvent]:
    """Return every event of a stream."""
    return [event async for event in stream]


async def collect_failure(
    stream: AsyncIterator[InferenceEvent],
) -> tuple[list[InferenceEvent], ProviderFailure]:
    """Return the events a stream yielded before it raised ``ProviderFailure``, and it."""
    events: list[InferenceEvent] = []
    try:
        async for event in stream:
            events.append(event)
    except ProviderFailure as failure:
        return events, failure
    raise AssertionError(f"the stream did not fail; it yielded {events}")


def text_of(events: Sequence[InferenceEvent]) -> str:
    """Return the message text the events carry."""
    return "".join(e.text for e in events if isinstance(e, MessageDelta))


def reasoning_of(events: Sequence[InferenceEvent]) -> str:
    """Return the reasoning text the events carry."""
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))
