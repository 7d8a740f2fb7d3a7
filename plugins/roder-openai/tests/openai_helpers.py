"""Helpers shared by the roder-openai tests: engines on the loopback server, collecting."""

from __future__ import annotations

from typing import Any

from openai_loopback import KEY_ENV, LoopbackServer

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
from roder_openai import EngineSettings, OpenAIChatEngine, OpenAIResponsesEngine

__all__ = [
    "COMPACT_CTX",
    "CTX",
    "chat_engine",
    "responses_engine",
    "collect",
    "collect_failure",
    "reasoning_of",
    "request",
    "text_of",
]

CTX = TURN_CTX


def responses_engine(server: LoopbackServer, **table: Any) -> OpenAIResponsesEngine:
    """Return an ``openai`` engine pointed at the server, with the test key's variable."""
    settings = {"base_url": server.base_url, "api_key_env": KEY_ENV, **table}
    return OpenAIResponsesEngine(EngineSettings.from_table("openai", settings))


def chat_engine(server: LoopbackServer, **table: Any) -> OpenAIChatEngine:
    """Return an ``openai-chat`` engine pointed at the server (no key unless given)."""
    settings = {"base_url": server.base_url, **table}
    return OpenAIChatEngine(EngineSettings.from_table("openai-chat", settings))


def request(*items: TranscriptItem, **kwargs: Any) -> AgentInferenceRequest:
    """Return a request for ``gpt-test`` with the given transcript (a greeting by default)."""
    return request_for(kwargs.pop("model", "gpt-test"), *items, **kwargs)
