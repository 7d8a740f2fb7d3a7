"""Registers the ``openai`` (Responses) and ``openai-chat`` (Chat Completions) engines."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.inference import InferenceEngine
from roder_openai._chat import OpenAIChatEngine
from roder_openai._responses import OpenAIResponsesEngine
from roder_openai._settings import EngineSettings


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register ``openai`` and ``openai-chat``, each configured by its own table."""
    register(OpenAIResponsesEngine(EngineSettings.from_table("openai", settings.get("openai"))))
    register(
        OpenAIChatEngine(EngineSettings.from_table("openai-chat", settings.get("openai-chat")))
    )
