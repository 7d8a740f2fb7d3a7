"""Loading the plugins, and what the configuration names that they do not have.

:func:`load_registry` loads the installed plugins and refuses a configuration that names
what they do not have. Some mistakes can only be seen once the plugins are loaded: a
``type`` no installed engine has, a tool name no plugin registered, a plugin's own
top-level table (``[mcp_servers]``) that its plugin reported wrong. Each is a
``ConfigError`` with the file and line the name was written on.
"""

from __future__ import annotations

import contextlib
import threading

import anyio

from roder_api.errors import ConfigError
from roder_api.extension import ExtensionRegistry, ExtensionRegistryBuilder
from roder_runtime.config._config import PLUGIN_TABLES, RuntimeConfig

_CLOSE_TIMEOUT_S = 30.0
"""How long closing a registry that is refused may take (MCP servers were started)."""


def loaded_problems(config: RuntimeConfig, registry: ExtensionRegistry) -> list[ConfigError]:
    """Return every mistake of ``config`` that ``registry`` (its plugins loaded) shows."""
    problems = _engine_type_problems(config, registry)
    problems.extend(_tool_name_problems(config, registry))
    lazy = _lazy_table_mistakes(config, registry)  # first: it may import observer plugins
    misconfigured = {**registry.misconfigured, **lazy}
    for id, (plugin, reason) in misconfigured.items():
        if id.split(".", 1)[0] in PLUGIN_TABLES:
            problems.append(ConfigError(f"{reason} (plugin {plugin!r})"))
    return problems


def _lazy_table_mistakes(
    config: RuntimeConfig, registry: ExtensionRegistry
) -> dict[str, tuple[str, str]]:
    """Return what lazy plugins say of the top-level tables they own (``[mcp_servers]``,
    ``[otel]``), so that a wrong one is refused at start-up as before they were lazy.

    Only when such a table is written: the observer plugins are imported (they would be
    at the first journaled batch anyway), and the tool plugins checked with ``check_only``
    in a registry of their own (an MCP server is started only when a turn needs tools).
    """
    if not any(config.plugin_tables.values()) or all(i.imported for i in registry.plugins):
        return {}
    len(registry.observers)  # imports the observer plugins; they check their tables
    builder = ExtensionRegistryBuilder(
        settings=config.plugin_settings(), locate=config.setting_source, check_only=True
    )
    builder.load_entry_points()
    checked = builder.build()
    len(checked.tools)  # imports the tool plugins; check_only: they start nothing
    return dict(checked.misconfigured)


def _where(config: RuntimeConfig, key: str) -> str | None:
    found = config.sources.get(key)
    return None if found in (None, "default") else found


def _engine_type_problems(config: RuntimeConfig, registry: ExtensionRegistry) -> list[ConfigError]:
    problems = []
    for engine_id, table in config.engines.items():
        declared = table.get("type")
        if declared is None or engine_id in registry.engines:
            continue
        if engine_id in registry.misconfigured:
            continue  # its plugin took the table and said what is wrong with it
        # Only now are the engines' types listed: that imports every engine plugin.
        types = sorted({e.engine_type for e in registry.engines.values() if e.engine_type})
        problems.append(
            ConfigError(
                f"[engines.{engine_id}] type {declared!r} is not an engine type; the engine "
                f"types installed: {', '.join(types) or 'none'}",
                source=_where(config, f"engines.{engine_id}.type"),
                key=f"engines.{engine_id}.type",
            )
        )
    return problems


def _tool_name_problems(config: RuntimeConfig, registry: ExtensionRegistry) -> list[ConfigError]:
    # An MCP server's tools are known only once it runs (it may be down, or not started by
    # `roder config check`): a name with a configured server's prefix is taken on trust.
    prefixes = tuple(f"{name}__" for name in config.mcp_servers)

    def known(name: str) -> bool:
        return (
            # The prefix first: asking the registry may import plugins with tools.
            name.startswith(prefixes) or name in registry.tools or name in registry.tool_conflicts
        )

    def registered() -> str:  # only for an error: it imports the plugins that have tools
        return ", ".join(sorted(registry.tools)) or "none"

    problems = []
    for name in config.tools.enabled or ():
        if not known(name):
            problems.append(
                ConfigError(
                    f"[tools] enabled: no tool is named {name!r}; registered tools: {registered()}",
                    source=_where(config, "tools.enabled"),
                    key="tools.enabled",
                )
            )
    for name in config.tools.approval:
        if not known(name):
            problems.append(
                ConfigError(
                    f"[tools.approval] {name}: no tool is named {name!r}; registered tools: "
                    f"{registered()}",
                    source=_where(config, f"tools.approval.{name}"),
                    key=f"tools.approval.{name}",
                )
            )
    return problems


def close_refused(registry: ExtensionRegistry) -> None:
    """Close a registry that is not handed out (its plugins may have started servers).

    Blocking; it runs the close on an event loop of its own in a thread, so that it works
    whether or not the caller is inside one.
    """

    def close() -> None:
        with contextlib.suppress(Exception):
            anyio.run(registry.aclose)

    thread = threading.Thread(target=close, name="roder-close-refused", daemon=True)
    thread.start()
    thread.join(_CLOSE_TIMEOUT_S)


def load_registry(config: RuntimeConfig) -> ExtensionRegistry:
    """Return the registry of the installed plugins, each handed its settings from ``config``.

    Blocking: it imports the plugins' modules. Raise ``ConfigError`` (file and line) when
    the configuration names what the loaded plugins do not have (an engine ``type``, a
    tool) or a plugin reported its own top-level table wrong (``[mcp_servers]``).
    """
    builder = ExtensionRegistryBuilder(
        settings=config.plugin_settings(), locate=config.setting_source
    )
    builder.load_entry_points()
    registry = builder.build()
    problems = loaded_problems(config, registry)
    if problems:
        close_refused(registry)
        raise problems[0]
    return registry
