"""What the registry holds: :class:`PluginInfo` and the immutable :class:`ExtensionRegistry`.

Both are public through :mod:`roder_api.extension`, which builds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from roder_api import _lazy
from roder_api.commands import Command
from roder_api.errors import (
    DuplicateRegistrationError,
    MisconfiguredPluginError,
    PluginLoadError,
    UnknownEngineError,
    UnknownThreadStoreError,
    UnknownToolError,
)

if TYPE_CHECKING:  # annotations only: a registry of lazy plugins imports no contract module
    from roder_api.inference import InferenceEngine
    from roder_api.observers import Observer
    from roder_api.threads import ThreadStoreFactory
    from roder_api.tools import Tool


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What one plugin is and what it registered, or why it failed to load."""

    name: str
    version: str | None = None
    distribution: str | None = None
    hooks: tuple[str, ...] = ()
    engines: tuple[str, ...] = ()
    thread_stores: tuple[str, ...] = ()
    error: str | None = None
    tools: tuple[str, ...] = ()
    misconfigured: Mapping[str, str] = field(default_factory=dict)
    """Ids this plugin could not set up from their settings, each with the reason."""
    observers: int = 0
    """How many observers the plugin registered."""
    commands: tuple[str, ...] = ()
    """The ``roder`` sub-commands the plugin registered."""
    imported: bool = True
    """False while a lazy plugin is not imported: the ids above are what it declared."""
    summary: str | None = None
    """Its distribution's one-line summary (``roder --help`` shows it for lazy commands)."""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object ``roder plugins --json`` prints for this plugin."""
        return {
            "name": self.name,
            "version": self.version,
            "distribution": self.distribution,
            "hooks": list(self.hooks),
            "engines": list(self.engines),
            "thread_stores": list(self.thread_stores),
            "tools": list(self.tools),
            "misconfigured": dict(self.misconfigured),
            "observers": self.observers,
            "commands": list(self.commands),
            "imported": self.imported,
            "error": self.error,
        }


@dataclass(frozen=True)
class ExtensionRegistry:
    """The engines, thread-store factories and tools available, by id; immutable once built.

    ``tool_conflicts`` holds the tool names registered twice (by name): neither
    registration is in ``tools``, and :meth:`tool` raises the conflict.

    Lazy plugins (see ``roder_api._lazy``; docs/plugin-hooks.md) are imported on first use:
    their declared ids are keys of ``engines``, ``thread_store_factories`` and ``commands``
    from the start, and looking one up imports its plugin; reading ``tools`` or
    ``tool_conflicts`` imports every plugin that declares tools; iterating ``observers``
    those that declare observers. A declared id whose plugin failed to import raises
    ``PluginLoadError`` naming the plugin. :meth:`load_all` imports the rest.
    """

    engines: Mapping[str, InferenceEngine]
    thread_store_factories: Mapping[str, ThreadStoreFactory]
    plugins: Sequence[PluginInfo] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, Tool] = field(default_factory=dict)
    tool_conflicts: Mapping[str, DuplicateRegistrationError] = field(default_factory=dict)
    misconfigured: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Ids an installed plugin could not set up from their settings: id -> (plugin, reason)."""
    commands: Mapping[str, Command] = field(default_factory=dict)
    """The ``roder`` sub-commands plugins registered (hook ``register_commands``), by name."""
    observers: Sequence[Observer] = ()
    """The observers of journaled events (the runtime serves and closes them)."""
    _loader: _lazy.Loader | None = field(default=None, repr=False, compare=False)

    def inference_engine(self, engine_id: str) -> InferenceEngine:
        """Return the engine registered as ``engine_id``.

        Raise ``MisconfiguredPluginError`` when an installed plugin reported the id as
        misconfigured, else ``UnknownEngineError`` when nothing has it.
        """
        try:
            return self.engines[engine_id]
        except KeyError:
            self._raise_misconfigured("inference engine", engine_id)
            self._raise_failed(_lazy.ENGINES, engine_id)
            raise UnknownEngineError(engine_id, self.engines) from None

    def thread_store_factory(self, store_id: str) -> ThreadStoreFactory:
        """Return the factory registered as ``store_id``.

        Raise ``MisconfiguredPluginError`` when an installed plugin reported the id as
        misconfigured, else ``UnknownThreadStoreError`` when nothing has it.
        """
        try:
            return self.thread_store_factories[store_id]
        except KeyError:
            self._raise_misconfigured("thread store", store_id)
            self._raise_failed(_lazy.THREAD_STORES, store_id)
            raise UnknownThreadStoreError(store_id, self.thread_store_factories) from None

    def _raise_misconfigured(self, kind: str, id: str) -> None:
        found = self.misconfigured.get(id)
        if found is not None:
            raise MisconfiguredPluginError(kind, id, found[0], found[1]) from None

    def _raise_failed(self, kind: str, id: str) -> None:
        failed = self._loader._failed_owner(kind, id) if self._loader is not None else None
        if failed is not None:
            raise PluginLoadError(failed.name, failed.error or "failed") from None

    def load_all(self) -> tuple[PluginInfo, ...]:
        """Import every lazy plugin not imported yet; return every plugin's info.

        Blocking. For what must show everything a plugin registers (``roder plugins``,
        ``roder config check``) or must not import later on an event loop.
        """
        if self._loader is not None:
            self._loader._load_kind(None)
        return tuple(self.plugins)

    def tool(self, name: str) -> Tool:
        """Return the tool registered as ``name``; raise ``UnknownToolError``.

        A name registered twice raises its ``DuplicateRegistrationError`` instead.
        """
        try:
            return self.tools[name]
        except KeyError:
            conflict = self.tool_conflicts.get(name)
            if conflict is not None:
                raise conflict from None
            self._raise_failed(_lazy.TOOLS, name)
            raise UnknownToolError(name, self.tools) from None

    def command(self, name: str) -> Command:
        """Return the ``roder`` sub-command registered as ``name``; raise ``KeyError``.

        A declared command whose plugin failed to import raises ``PluginLoadError``.
        """
        try:
            return self.commands[name]
        except KeyError:
            self._raise_failed(_lazy.COMMANDS, name)
            raise

    @property
    def load_errors(self) -> tuple[PluginLoadError, ...]:
        """Return an error for each plugin that failed to load."""
        return tuple(PluginLoadError(p.name, p.error) for p in self.plugins if p.error)

    async def aclose(self) -> None:
        """Close every registered engine and tool (those imported: closing imports nothing)."""
        loader = self._loader
        engines = loader._table(_lazy.ENGINES) if loader is not None else self.engines
        tools = loader._table(_lazy.TOOLS) if loader is not None else self.tools
        for engine in list(engines.values()):
            await engine.aclose()
        for tool in list(tools.values()):
            await tool.aclose()


def lazy_registry(loader: _lazy.Loader) -> ExtensionRegistry:
    """Return a registry whose tables are live views of ``loader`` (a private builder)."""
    return ExtensionRegistry(
        engines=_lazy.LazyTable(loader, _lazy.ENGINES),
        thread_store_factories=_lazy.LazyTable(loader, _lazy.THREAD_STORES),
        plugins=_lazy.LazyList(loader._plugins, lambda: False, lambda: None),
        sources=MappingProxyType(loader._sources),
        tools=_lazy.LazyTable(loader, _lazy.TOOLS, whole_kind=True),
        tool_conflicts=_lazy.LazyTable(loader, _lazy.TOOL_CONFLICTS, whole_kind=True),
        commands=_lazy.LazyTable(loader, _lazy.COMMANDS, declared_is_in=True),
        misconfigured=MappingProxyType(loader._misconfigured),
        observers=_lazy.LazyList(
            loader._observers,
            lambda: loader._has_pending(_lazy.OBSERVERS),
            lambda: loader._load_kind(_lazy.OBSERVERS),
        ),
        _loader=loader,
    )


__all__ = ["ExtensionRegistry", "PluginInfo", "lazy_registry"]
