"""Registers the deterministic ``scripted`` engine (``roder_api.testing.ScriptedEngine``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.inference import InferenceEngine
from roder_api.testing import ScriptedEngine


@hookimpl
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register the ``scripted`` engine.

    ``[engines.scripted]`` settings: ``context_window`` (tokens) and ``delta_delay_ms``
    (a pause before each word of the default reply, to watch it stream).
    """
    table = settings.get("scripted", {})
    register(
        ScriptedEngine(
            context_window=int(table.get("context_window", 128_000)),
            delta_delay=float(table.get("delta_delay_ms", 0)) / 1000,
        )
    )
