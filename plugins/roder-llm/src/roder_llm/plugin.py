"""Registers the ``llm`` engine (every model of the installed simonw/llm plugins)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.inference import InferenceEngine
from roder_llm._engine import ENGINE_ID, LlmEngine
from roder_llm._settings import LlmSettings


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register ``llm``, configured by its ``[engines.llm]`` table."""
    register(LlmEngine(LlmSettings.from_table(ENGINE_ID, settings.get(ENGINE_ID))))
