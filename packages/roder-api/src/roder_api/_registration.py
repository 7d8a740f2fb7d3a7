"""What a registration must be: the checks the registry builder runs on each object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roder_api.errors import PluginSettingsError
from roder_api.inference import InferenceEngine
from roder_api.threads import ThreadStoreFactory
from roder_api.tools import Tool, check_tool_name


def collector(target: list[Any], kind: type) -> Callable[[Any], None]:
    """Return a ``register`` callback that appends objects of ``kind`` to ``target``."""

    def register(obj: Any) -> None:
        if not isinstance(obj, kind):
            raise TypeError(f"register() expects a {kind.__name__}, got {type(obj).__name__}")
        target.append(obj)

    return register


def engine_id(engine: InferenceEngine) -> str:
    """Return an engine's id; raise ``TypeError``/``ValueError`` for a bad registration."""
    if not isinstance(engine, InferenceEngine):
        raise TypeError(f"expected an InferenceEngine, got {type(engine).__name__}")
    if not isinstance(engine.id, str) or not engine.id:
        raise ValueError(f"engine {engine!r} has no id; set the `id` attribute")
    return engine.id


def tool_name(tool: Tool) -> str:
    """Return a tool's checked name; raise ``TypeError`` for a non-tool."""
    if not isinstance(tool, Tool):
        raise TypeError(f"expected a Tool, got {type(tool).__name__}")
    return check_tool_name(tool.name)


def factory_id(factory: ThreadStoreFactory) -> str:
    """Return a store factory's id; raise ``TypeError``/``ValueError`` for a bad one."""
    if not isinstance(factory, ThreadStoreFactory):
        raise TypeError(f"expected a ThreadStoreFactory, got {type(factory).__name__}")
    if not isinstance(factory.id, str) or not factory.id:
        raise ValueError(f"thread store factory {factory!r} has no id; set the `id` attribute")
    return factory.id


def reason_of(
    error: BaseException | str, locate: Callable[[str, str | None], str | None] | None
) -> str:
    """Return a one-line reason, led by where the bad setting was written (``locate``)."""
    if isinstance(error, str):
        return error
    if isinstance(error, PluginSettingsError):
        where = error.source
        if error.line is not None and where is not None:
            where = f"{where}:{error.line}"
        if where is None and locate is not None:
            where = locate(error.settings_id, error.setting)
        return f"{where}: {error.reason}" if where else error.reason
    return f"{type(error).__name__}: {error}"
