"""Plugin discovery and the extension registry.

``ExtensionRegistryBuilder`` takes registrations directly (tests, scripts) and from installed
distributions' entry points in the ``roder`` group; ``build()`` returns an immutable
``ExtensionRegistry``. The builder is the only code that calls hooks. Where plugins come
from (the entry-point group, ``RODER_PLUGINS``, importing each with a deadline) is in
``roder_api._plugin_loading``; its public names are importable from here.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pluggy

from roder_api import hookspecs
from roder_api._markers import PROJECT_NAME
from roder_api._plugin_loading import (
    DEFAULT_IMPORT_TIMEOUT_S,
    ENTRY_POINT_GROUP,
    IMPORT_TIMEOUT_ENV,
    NOT_INSTALLED,
    PLUGINS_ENV,
    import_timeout_s,
    load_with_deadline,
    plugin_names_from_env,
)
from roder_api._registration import collector, engine_id, factory_id, tool_name
from roder_api.commands import Command
from roder_api.errors import (
    DuplicateRegistrationError,
    MisconfiguredPluginError,
    PluginLoadError,
    PluginSettingsError,
    UnknownEngineError,
    UnknownThreadStoreError,
    UnknownToolError,
)
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
            "error": self.error,
        }


@dataclass(frozen=True)
class ExtensionRegistry:
    """The engines, thread-store factories and tools available, by id; immutable once built.

    ``tool_conflicts`` holds the tool names registered twice (by name): neither
    registration is in ``tools``, and :meth:`tool` raises the conflict.
    """

    engines: Mapping[str, InferenceEngine]
    thread_store_factories: Mapping[str, ThreadStoreFactory]
    plugins: tuple[PluginInfo, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, Tool] = field(default_factory=dict)
    tool_conflicts: Mapping[str, DuplicateRegistrationError] = field(default_factory=dict)
    misconfigured: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Ids an installed plugin could not set up from their settings: id -> (plugin, reason)."""
    commands: Mapping[str, Command] = field(default_factory=dict)
    """The ``roder`` sub-commands plugins registered (hook ``register_commands``), by name."""
    observers: tuple[Observer, ...] = ()
    """The observers of journaled events (the runtime serves and closes them)."""

    def inference_engine(self, engine_id: str) -> InferenceEngine:
        """Return the engine registered as ``engine_id``.

        Raise ``MisconfiguredPluginError`` when an installed plugin reported the id as
        misconfigured, else ``UnknownEngineError`` when nothing has it.
        """
        try:
            return self.engines[engine_id]
        except KeyError:
            self._raise_misconfigured("inference engine", engine_id)
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
            raise UnknownThreadStoreError(store_id, self.thread_store_factories) from None

    def _raise_misconfigured(self, kind: str, id: str) -> None:
        found = self.misconfigured.get(id)
        if found is not None:
            raise MisconfiguredPluginError(kind, id, found[0], found[1]) from None

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
            raise UnknownToolError(name, self.tools) from None

    @property
    def load_errors(self) -> tuple[PluginLoadError, ...]:
        """Return an error for each plugin that failed to load."""
        return tuple(PluginLoadError(p.name, p.error) for p in self.plugins if p.error)

    async def aclose(self) -> None:
        """Close every registered engine and tool."""
        for engine in self.engines.values():
            await engine.aclose()
        for tool in self.tools.values():
            await tool.aclose()


class ExtensionRegistryBuilder:
    """Collects engines and thread-store factories, then ``build()`` s a registry.

    ``settings`` maps engine and store ids to their configuration tables; plugins that
    accept the opt-in ``settings`` hook argument receive it. ``locate(id, key)`` returns
    where a setting was written (``config.toml:7``), to put in front of the reason a plugin
    gives for a bad setting (``PluginSettingsError``). ``check_only`` is handed to the
    ``register_tools`` hook: check settings, start nothing (``roder config check``).
    """

    def __init__(
        self,
        *,
        settings: Mapping[str, Mapping[str, Any]] | None = None,
        locate: Callable[[str, str | None], str | None] | None = None,
        check_only: bool = False,
    ) -> None:
        self._settings: Mapping[str, Mapping[str, Any]] = MappingProxyType(
            {k: MappingProxyType(dict(v)) for k, v in (settings or {}).items()}
        )
        self._locate = locate
        self._check_only = check_only
        self._misconfigured: dict[str, tuple[str, str]] = {}
        self._engines: dict[str, InferenceEngine] = {}
        self._factories: dict[str, ThreadStoreFactory] = {}
        self._tools: dict[str, Tool] = {}
        self._tool_conflicts: dict[str, DuplicateRegistrationError] = {}
        self._commands: dict[str, Command] = {}
        self._sources: dict[str, str] = {}
        self._plugins: list[PluginInfo] = []
        self._observers: list[Observer] = []

    def inference_engine(
        self, engine: InferenceEngine, *, source: str = "a direct registration"
    ) -> ExtensionRegistryBuilder:
        """Register an engine; raise ``DuplicateRegistrationError`` if its id is taken."""
        self._add("inference engine", self._engines, engine_id(engine), engine, source)
        return self

    def thread_store_factory(
        self, factory: ThreadStoreFactory, *, source: str = "a direct registration"
    ) -> ExtensionRegistryBuilder:
        """Register a thread-store factory; raise ``DuplicateRegistrationError`` if taken."""
        self._add("thread store", self._factories, factory_id(factory), factory, source)
        return self

    def tool(
        self, tool: Tool, *, source: str = "a direct registration"
    ) -> ExtensionRegistryBuilder:
        """Register a tool; raise ``DuplicateRegistrationError`` if its name is taken.

        On a duplicate neither registration is used (the name is left out of the registry).
        """
        name = tool_name(tool)
        key = f"tool:{name}"
        if name in self._tools or name in self._tool_conflicts:
            first = self._sources.get(key, "an earlier registration")
            error = DuplicateRegistrationError("tool", name, first, source)
            self._tools.pop(name, None)
            self._tool_conflicts.setdefault(name, error)
            raise error
        self._tools[name] = tool
        self._sources[key] = source
        return self

    def command(
        self, command: Command, *, source: str = "a direct registration"
    ) -> ExtensionRegistryBuilder:
        """Register a ``roder`` sub-command; raise ``DuplicateRegistrationError`` if taken."""
        if not isinstance(command, Command):
            raise TypeError(f"expected a roder_api.commands.Command, got {command!r}")
        self._add("command", self._commands, command.name, command, source)
        return self

    def observer(self, observer: Observer) -> ExtensionRegistryBuilder:
        """Register an observer of journaled events (see ``roder_api.observers``)."""
        if not isinstance(observer, Observer):
            raise TypeError(f"not an observer: {type(observer).__name__} has no observe()")
        self._observers.append(observer)
        return self

    def _add(self, kind: str, table: dict[str, Any], id: str, obj: object, source: str) -> None:
        key = f"{kind}:{id}"
        if id in table:
            raise DuplicateRegistrationError(kind, id, self._sources[key], source)
        table[id] = obj
        self._sources[key] = source

    def load_entry_points(
        self,
        *,
        names: Iterable[str] | None = None,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    ) -> tuple[PluginInfo, ...]:
        """Load the installed plugins of the ``roder`` entry-point group.

        ``names`` limits which are loaded (default: ``RODER_PLUGINS``, or all when unset).
        A plugin that fails to import, raises in a hook or registers a taken id is reported
        in its ``PluginInfo.error`` and registers nothing; the others still load.
        Return the infos of the plugins considered.
        """
        allowed = frozenset(names) if names is not None else plugin_names_from_env()
        found = entry_points
        if found is None:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        infos: list[PluginInfo] = []
        seen: set[str] = set()
        found = list(found)
        for ep in sorted(found, key=lambda e: e.name):
            if allowed is not None and ep.name not in allowed:
                continue
            if ep.name in seen:
                continue
            seen.add(ep.name)
            infos.append(self._load_one(ep))
        for missing in sorted((allowed or frozenset()) - {ep.name for ep in found}):
            # A name in RODER_PLUGINS that nothing installed has: a typo, or a plugin that
            # is not installed. Reported, not silently ignored.
            installed = ", ".join(sorted({ep.name for ep in found})) or "none"
            infos.append(
                PluginInfo(
                    missing,
                    error=f"{NOT_INSTALLED} (named in {PLUGINS_ENV}; installed plugins: "
                    f"{installed})",
                )
            )
        self._plugins.extend(infos)
        return tuple(infos)

    def load_plugin(self, name: str, plugin: object) -> PluginInfo:
        """Load an already imported plugin object (a module or instance with hookimpls)."""
        info = self._load_module(name, plugin, version=None, distribution=None)
        self._plugins.append(info)
        return info

    def _load_one(self, ep: importlib.metadata.EntryPoint) -> PluginInfo:
        dist = getattr(ep, "dist", None)
        version = dist.version if dist is not None else None
        dist_name = dist.metadata["Name"] if dist is not None else None
        try:
            module = load_with_deadline(ep, import_timeout_s())
        except BaseException as exc:  # noqa: BLE001 - a plugin's import may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            return PluginInfo(ep.name, version, dist_name, error=f"{type(exc).__name__}: {exc}")
        return self._load_module(ep.name, module, version=version, distribution=dist_name)

    def _load_module(
        self, name: str, plugin: object, *, version: str | None, distribution: str | None
    ) -> PluginInfo:
        pm = pluggy.PluginManager(PROJECT_NAME)
        pm.add_hookspecs(hookspecs)
        try:
            pm.register(plugin, name=name)
        except Exception as exc:  # noqa: BLE001 - report bad hookimpls as a load error
            return PluginInfo(name, version, distribution, error=f"{type(exc).__name__}: {exc}")
        hook_names = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))
        engines: list[InferenceEngine] = []
        factories: list[ThreadStoreFactory] = []
        tools: list[Tool] = []
        commands: list[Command] = []
        observers: list[Observer] = []
        source = f"plugin {name!r}"
        misconfigured: dict[str, str] = {}

        def report(id: str, error: BaseException | str) -> None:
            misconfigured[str(id)] = self._reason(error)

        try:
            self._call(
                pm, "register_inference_engines", collector(engines, InferenceEngine), report
            )
            self._call(
                pm,
                "register_thread_store_factories",
                collector(factories, ThreadStoreFactory),
                report,
            )
            self._call(pm, "register_tools", collector(tools, Tool), report, tools_hook=True)
            self._call(pm, "register_commands", collector(commands, Command), report)
            self._call(pm, "register_observers", collector(observers, Observer))
            # Check every id before committing any, so a plugin registers all or nothing.
            pending: set[str] = set()
            for engine in engines:
                key = f"inference engine:{engine_id(engine)}"
                if key in self._sources or key in pending:
                    first = self._sources.get(key, source)
                    raise DuplicateRegistrationError(
                        "inference engine", engine_id(engine), first, source
                    )
                pending.add(key)
            for factory in factories:
                key = f"thread store:{factory_id(factory)}"
                if key in self._sources or key in pending:
                    first = self._sources.get(key, source)
                    raise DuplicateRegistrationError(
                        "thread store", factory_id(factory), first, source
                    )
                pending.add(key)
            for command in commands:
                key = f"command:{command.name}"
                if key in self._sources or key in pending:
                    first = self._sources.get(key, source)
                    raise DuplicateRegistrationError("command", command.name, first, source)
                pending.add(key)
            for tool in tools:
                key = f"tool:{tool_name(tool)}"
                if key in pending:
                    raise DuplicateRegistrationError("tool", tool.name, source, source)
                pending.add(key)
        except PluginSettingsError as exc:
            # Bad settings: the ids the table was for are misconfigured, not unknown.
            reason = self._reason(exc)
            misconfigured[exc.settings_id] = reason
            self._note_misconfigured(name, misconfigured)
            return PluginInfo(
                name,
                version,
                distribution,
                hook_names,
                error=f"misconfigured: {reason}",
                misconfigured=MappingProxyType(dict(misconfigured)),
            )
        except Exception as exc:  # noqa: BLE001 - a plugin's hook may raise anything
            self._note_misconfigured(name, misconfigured)
            return PluginInfo(
                name, version, distribution, hook_names, error=f"{type(exc).__name__}: {exc}"
            )
        self._note_misconfigured(name, misconfigured)
        for engine in engines:
            self.inference_engine(engine, source=source)
        for factory in factories:
            self.thread_store_factory(factory, source=source)
        for command in commands:
            self.command(command, source=source)
        for tool in tools:
            # A name another plugin has: neither is used; ExtensionRegistry.tool_conflicts
            # reports it (by both sources) and `roder plugins` shows it.
            with contextlib.suppress(DuplicateRegistrationError):
                self.tool(tool, source=source)
        self._observers.extend(observers)
        return PluginInfo(
            name,
            version,
            distribution,
            hook_names,
            tuple(engine_id(e) for e in engines),
            tuple(factory_id(f) for f in factories),
            tools=tuple(t.name for t in tools),
            misconfigured=MappingProxyType(dict(misconfigured)),
            observers=len(observers),
        )

    def _call(
        self,
        pm: pluggy.PluginManager,
        hook_name: str,
        register: Callable[[Any], None],
        misconfigured: Callable[[str, BaseException | str], None] | None = None,
        *,
        tools_hook: bool = False,
    ) -> None:
        caller = getattr(pm.hook, hook_name)
        if tools_hook:
            caller(
                register=register,
                settings=self._settings,
                misconfigured=misconfigured,
                check_only=self._check_only,
            )
        elif misconfigured is None:
            caller(register=register, settings=self._settings)
        else:
            caller(register=register, settings=self._settings, misconfigured=misconfigured)

    def _reason(self, error: BaseException | str) -> str:
        """Return a one-line reason, led by where the bad setting was written."""
        if isinstance(error, str):
            return error
        if isinstance(error, PluginSettingsError):
            where = error.source
            if error.line is not None and where is not None:
                where = f"{where}:{error.line}"
            if where is None and self._locate is not None:
                where = self._locate(error.settings_id, error.setting)
            return f"{where}: {error.reason}" if where else error.reason
        return f"{type(error).__name__}: {error}"

    def _note_misconfigured(self, plugin: str, found: Mapping[str, str]) -> None:
        for id, reason in found.items():
            self._misconfigured.setdefault(id, (plugin, reason))

    def build(self) -> ExtensionRegistry:
        """Return an immutable registry of everything registered so far."""
        return ExtensionRegistry(
            engines=MappingProxyType(dict(self._engines)),
            thread_store_factories=MappingProxyType(dict(self._factories)),
            plugins=tuple(self._plugins),
            sources=MappingProxyType(dict(self._sources)),
            tools=MappingProxyType(dict(self._tools)),
            tool_conflicts=MappingProxyType(dict(self._tool_conflicts)),
            commands=MappingProxyType(dict(self._commands)),
            misconfigured=MappingProxyType(dict(self._misconfigured)),
            observers=tuple(self._observers),
        )


__all__ = [
    "DEFAULT_IMPORT_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "ExtensionRegistry",
    "ExtensionRegistryBuilder",
    "IMPORT_TIMEOUT_ENV",
    "NOT_INSTALLED",
    "PLUGINS_ENV",
    "PluginInfo",
    "import_timeout_s",
    "plugin_names_from_env",
]
