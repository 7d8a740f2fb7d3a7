"""Registers the ``anthropic`` engine (the Messages API), and one more engine for each
``[engines.<id>]`` table with ``type = "anthropic"`` (a second account, a proxy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_anthropic._engine import AnthropicEngine
from roder_anthropic._settings import AnthropicSettings, AnthropicSettingsError
from roder_api import hookimpl
from roder_api.inference import InferenceEngine

ENGINE_TYPE = "anthropic"
"""The ``type`` of an ``[engines.<id>]`` table that makes an engine of this plugin."""


def engine_ids(settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Return the engines to make: ``anthropic``, then one per ``type = "anthropic"`` table.

    An ``[engines.anthropic]`` table whose ``type`` names another kind is left to that kind.
    """
    ids = [] if _declared(settings.get("anthropic")) not in (None, ENGINE_TYPE) else ["anthropic"]
    for engine_id, table in settings.items():
        if engine_id != "anthropic" and _declared(table) == ENGINE_TYPE:
            ids.append(engine_id)
    return ids


def _declared(table: object) -> object:
    return table.get("type") if isinstance(table, Mapping) else None


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register ``anthropic`` and each ``type = "anthropic"`` engine, each by its own table.

    A bad table is reported for its id; the other engines still register.
    """
    for engine_id in engine_ids(settings):
        try:
            engine_settings = AnthropicSettings.from_table(engine_id, settings.get(engine_id))
        except AnthropicSettingsError as exc:
            misconfigured(engine_id, exc)
            continue
        register(AnthropicEngine(engine_settings, id=engine_id))
