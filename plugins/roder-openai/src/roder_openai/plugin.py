"""Registers the ``openai`` (Responses) and ``openai-chat`` (Chat Completions) engines, and
one more engine for each ``[engines.<id>]`` table with ``type = "openai"`` or
``type = "openai-chat"`` (an Ollama, a vLLM, ... side by side, each with its own URL, key
and models)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.inference import InferenceEngine
from roder_openai._chat import OpenAIChatEngine
from roder_openai._http import HttpEngine
from roder_openai._responses import OpenAIResponsesEngine
from roder_openai._settings import ENGINE_TYPES, EngineSettings, OpenAISettingsError

_CLASSES: dict[str, type[HttpEngine]] = {
    "openai": OpenAIResponsesEngine,
    "openai-chat": OpenAIChatEngine,
}


def engine_types(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Return the engines to make, id -> type: the two built in, then one per typed table.

    A table whose ``type`` names another plugin's engine is left to that plugin.
    """
    wanted = {engine_type: engine_type for engine_type in ENGINE_TYPES}
    for engine_id, table in settings.items():
        declared = table.get("type") if isinstance(table, Mapping) else None
        if declared is None:
            continue
        if declared in ENGINE_TYPES:
            wanted[engine_id] = str(declared)
        elif engine_id in wanted:
            del wanted[engine_id]
    return wanted


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register each engine configured by its own table; a bad table spares the others."""
    for engine_id, engine_type in engine_types(settings).items():
        try:
            engine_settings = EngineSettings.from_table(engine_id, settings.get(engine_id))
        except OpenAISettingsError as exc:
            misconfigured(engine_id, exc)
            continue
        register(_CLASSES[engine_type](engine_settings, id=engine_id))
