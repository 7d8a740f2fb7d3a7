"""The hooks a Roder plugin may implement.

Hooks are synchronous and hand the plugin a ``register`` callback; the async work lives in
the objects registered. ``settings`` is an opt-in argument (pluggy lets an implementation
take fewer arguments than the spec): a mapping from engine or store id to the table of
configuration meant for it (``[engines.<id>]``, ``[thread_store]``). Hooks only grow: new
arguments arrive as opt-in arguments. Every hook is documented in ``docs/plugin-hooks.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api._markers import hookspec
from roder_api.commands import Command
from roder_api.inference import InferenceEngine
from roder_api.observers import Observer
from roder_api.threads import ThreadStoreFactory
from roder_api.tools import Tool


@hookspec
def register_inference_engines(
    register: Callable[[InferenceEngine], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register inference engines by calling ``register(engine)`` once per engine.

    Called once when the extension registry is built (``load_entry_points``). ``settings``
    maps engine ids to their ``[engines.<id>]`` configuration table. ``misconfigured(id,
    error)`` (opt-in) reports an engine that its table keeps from being built (raise
    ``roder_api.errors.PluginSettingsError`` for it) while the plugin's other engines still
    register; commands that need that id then say it is misconfigured, and why.
    """


@hookspec
def register_thread_store_factories(
    register: Callable[[ThreadStoreFactory], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register thread-store factories by calling ``register(factory)`` once per factory.

    Called once when the extension registry is built (``load_entry_points``). ``settings``
    maps store ids to their configuration (the ``[thread_store]`` table goes to the
    configured backend's id). ``misconfigured(id, error)`` (opt-in) reports a store its
    settings keep from working, as for engines; raising ``PluginSettingsError`` from the
    hook does the same for the id it names.
    """


@hookspec
def register_tools(
    register: Callable[[Tool], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
    check_only: bool,
) -> None:
    """Register tools the model may call by calling ``register(tool)`` once per tool.

    Called once when the extension registry is built (``load_entry_points``). Tool names
    are unique across plugins: two registrations of one name are an error naming both, and
    neither is used. ``settings`` is the same mapping the other hooks get; the
    ``mcp_servers`` entry maps MCP server names to their ``[mcp_servers.<name>]`` tables
    (each top-level table a plugin owns arrives this way, raw, keyed by its name).

    ``misconfigured(id, error)`` (opt-in) reports a table that is wrong (a
    ``PluginSettingsError`` whose ``settings_id`` is the top-level table, ``mcp_servers``,
    and ``setting`` the dotted key inside it, ``files.comand``) while the rest still
    registers. ``check_only`` (opt-in) is True for ``roder config check``: check the
    settings and report every mistake, but start nothing (no server, no process).
    ``misconfigured(name, DuplicateRegistrationError("tool", name, first, second))``
    reports a tool name the plugin leaves out because two of its own sources produce it
    (two MCP servers): it is listed with the plugin's tools and in
    ``ExtensionRegistry.tool_conflicts``, like a name two plugins register.
    """


@hookspec
def register_commands(
    register: Callable[[Command], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register ``roder`` sub-commands by calling ``register(command)`` once per command.

    Called once when the extension registry is built. A
    :class:`roder_api.commands.Command` names the sub-command, adds its arguments and is
    run with a :class:`roder_api.commands.CommandContext`. A name taken by a built-in
    command or another plugin is an error naming both. ``settings`` (opt-in) is the
    mapping the other hooks get; ``misconfigured(id, error)`` (opt-in) reports a wrong
    table the command's plugin owns (``PluginSettingsError("temporal", key, reason)``,
    id ``"temporal.<key>"``) while the command still registers: ``roder config check``
    shows it with its file and line.
    """


@hookspec
def register_observers(
    register: Callable[[Observer], None],
    settings: Mapping[str, Mapping[str, Any]],
) -> None:
    """Register observers of journaled events by calling ``register(observer)`` once each.

    Called once when the extension registry is built (``load_entry_points``). An observer
    (``roder_api.observers.Observer``) gets each batch of events after the store persisted
    it, from a bounded queue of its own; it can never block or fail a turn. ``settings``
    (opt-in) is the mapping the other hooks get; ``settings["otel"]`` is the ``[otel]``
    table.
    """
