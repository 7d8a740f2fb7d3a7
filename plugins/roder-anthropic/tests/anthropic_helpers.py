"""Helpers shared by the roder-anthropic tests: an engine on the loopback server, collecting."""

from __future__ import annotations

from typing import Any

from anthropic_loopback import KEY_ENV, LoopbackServer

from roder_anthropic import AnthropicEngine, AnthropicSettings
from roder_api.inference import AgentInferenceRequest
from roder_api.testing.loopback import (
    COMPACT_CTX,
    TURN_CTX,
    collect,
    collect_failure,
    reasoning_of,
    request_for,
    text_of,
)
from roder_api.transcript import TranscriptItem

__all__ = [
    "COMPACT_CTX",
    "CTX",
    "engine_on",
    "collect",
    "collect_failure",
    "reasoning_of",
    "request",
    "text_of",
]

CTX = TURN_CTX


def engine_on(server: LoopbackServer, **table: Any) -> AnthropicEngine:
    """Return an ``anthropic`` engine pointed at the server, with the test key's variable."""
    settings = {"base_url": server.base_url, "api_key_env": KEY_ENV, **table}
    return AnthropicEngine(AnthropicSettings.from_table("anthropic", settings))


def request(*items: TranscriptItem, **kwargs: Any) -> AgentInferenceRequest:
    """Return a request for ``claude-test`` with the given transcript (a greeting by default)."""
    return request_for(kwargs.pop("model", "claude-test"), *items, **kwargs)
