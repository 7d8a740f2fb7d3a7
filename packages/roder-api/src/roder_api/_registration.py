"""What a registration must be: the checks the registry builder runs on each object."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roder_api.errors import PluginSettingsError

if TYPE_CHECKING:  # imported by the checks that use them, when a plugin is loaded
    from roder_api.inference import InferenceEngine
    from roder_api.threads import ThreadStoreFactory
    from roder_api.tools import Tool


CONTRACTS = {
    "engine": ("roder_api.inference", "InferenceEngine"),
    "store": ("roder_api.threads", "ThreadStoreFactory"),
    "tool": ("roder_api.tools", "Tool"),
    "command": ("roder_api.commands", "Command"),
    "observer": ("roder_api.observers", "Observer"),
}
"""Each kind of registration and the contract class it must be an instance of."""


def contract(kind: str) -> type:
    """Return the contract class of a kind of registration (see :data:`CONTRACTS`),
    imported on first use: a registry built from plugins' declarations imports none."""
    module, name = CONTRACTS[kind]
    found: type = getattr(importlib.import_module(module), name)
    return found


def collector(target: list[Any], kind_name: str) -> Callable[[Any], None]:
    """Return a ``register`` callback that appends objects of a kind to ``target``."""
    kind = contract(kind_name)

    def register(obj: Any) -> None:
        if not isinstance(obj, kind):
            raise TypeError(f"register() expects a {kind.__name__}, got {type(obj).__name__}")
        target.append(obj)

    return register


def engine_id(engine: InferenceEngine) -> str:
    """Return an engine's id; raise ``TypeError``/``ValueError`` for a bad registration."""
    from roder_api.inference import InferenceEngine

    if not isinstance(engine, InferenceEngine):
        raise TypeError(f"expected an InferenceEngine, got {type(engine).__name__}")
    if not isinstance(engine.id, str) or not engine.id:
        raise ValueError(f"engine {engine!r} has no id; set the `id` attribute")
    return engine.id


def tool_name(tool: Tool) -> str:
    """Return a tool's checked name; raise ``TypeError`` for a non-tool."""
    from roder_api.tools import Tool, check_tool_name

    if not isinstance(tool, Tool):
        raise TypeError(f"expected a Tool, got {type(tool).__name__}")
    return check_tool_name(tool.name)


def factory_id(factory: ThreadStoreFactory) -> str:
    """Return a store factory's id; raise ``TypeError``/``ValueError`` for a bad one."""
    from roder_api.threads import ThreadStoreFactory

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
