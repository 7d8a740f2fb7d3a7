"""Registers the ``anthropic`` engine (the Messages API)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_anthropic._engine import AnthropicEngine
from roder_anthropic._settings import AnthropicSettings
from roder_api import hookimpl
from roder_api.inference import InferenceEngine


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register ``anthropic``, configured by its ``[engines.anthropic]`` table."""
    register(AnthropicEngine(AnthropicSettings.from_table("anthropic", settings.get("anthropic"))))
