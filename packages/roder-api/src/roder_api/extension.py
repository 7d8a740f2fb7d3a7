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
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pluggy

from roder_api import _lazy, hookspecs
from roder_api._markers import PROJECT_NAME
from roder_api._plugin_loading import (
    DEFAULT_IMPORT_TIMEOUT_S,
    ENTRY_POINT_GROUP,
    IMPORT_TIMEOUT_ENV,
    NOT_INSTALLED,
    PLUGINS_ENV,
    distribution_of,
    import_timeout_s,
    load_with_deadline,
    plugin_names_from_env,
)
from roder_api._registration import collector, engine_id, factory_id, reason_of, tool_name
from roder_api._registry import ExtensionRegistry, PluginInfo, lazy_registry
from roder_api.commands import Command
from roder_api.errors import DuplicateRegistrationError, PluginSettingsError
from roder_api.inference import InferenceEngine
from roder_api.observers import Observer
from roder_api.threads import ThreadStoreFactory
from roder_api.tools import Tool


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
        # Lazy plugins not imported yet, the "kind:id"s each declared (kept, to name a
        # plugin that failed), and those reserved for a plugin still pending.
        self._pending: dict[str, tuple[importlib.metadata.EntryPoint, _lazy.Declared]] = {}
        self._claims: dict[str, set[str]] = {}
        self._reserved: dict[str, str] = {}
        self._lock = threading.RLock()

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
        if id in table or key in self._reserved:
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
        A plugin that declares what it registers (entry-point groups ``roder.engines``,
        ``roder.thread_stores``, ...; docs/plugin-hooks.md) is not imported here: its ids
        are reserved and the registry imports it when one is first asked for (its info
        says ``imported=False`` until then). ``entry_points`` may hold those declarations
        too. Return the infos of the plugins considered.
        """
        allowed = frozenset(names) if names is not None else plugin_names_from_env()
        if entry_points is None:
            every = importlib.metadata.entry_points()
            found = list(every.select(group=ENTRY_POINT_GROUP))
            declaring = [ep for g in _lazy.DECLARATION_GROUPS for ep in every.select(group=g)]
        else:
            listed = list(entry_points)
            found = [ep for ep in listed if not _lazy.is_declaration(ep)]
            declaring = [ep for ep in listed if _lazy.is_declaration(ep)]
        declarations = _lazy.read_declarations(declaring)
        infos: list[PluginInfo] = []
        seen: set[str] = set()
        for ep in sorted(found, key=lambda e: e.name):
            if allowed is not None and ep.name not in allowed:
                continue
            if ep.name in seen:
                continue
            seen.add(ep.name)
            declared = declarations.get(ep.value)
            infos.append(self._defer(ep, declared) if declared else self._load_one(ep))
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

    def _defer(self, ep: importlib.metadata.EntryPoint, declared: _lazy.Declared) -> PluginInfo:
        """Reserve what a lazy plugin declares (an id taken is its load error); return its
        info, ``imported=False``."""
        version, dist_name, summary = distribution_of(ep)
        source = f"plugin {ep.name!r}"
        claims = [f"{kind}:{id}" for kind in _lazy.CLAIMED for id in declared.of(kind)]
        types = set(declared.of(_lazy.ENGINE_TYPES))
        for id, table in self._settings.items():
            # An [engines.X] table with a `type` makes X an engine of the plugin that has
            # the type, and of no other (whatever X's name is).
            wanted = table.get("type")
            if not isinstance(wanted, str):
                continue
            key = f"{_lazy.ENGINES}:{id}"
            if key in claims:
                claims.remove(key)
            if wanted in types:
                claims.append(key)
        claims = list(dict.fromkeys(claims))
        for key in claims:
            if key in self._sources:
                kind, _, id = key.partition(":")
                error = DuplicateRegistrationError(kind, id, self._sources[key], source)
                failed = f"{type(error).__name__}: {error}"
                return PluginInfo(ep.name, version, dist_name, error=failed)
        for key in claims:
            self._reserved[key] = ep.name
            self._sources[key] = source
        tools = {f"{_lazy.TOOLS}:{name}" for name in declared.ids.get(_lazy.TOOLS, ())}
        self._claims[ep.name] = set(claims) | tools
        self._pending[ep.name] = (ep, declared)

        def ids(kind: str) -> tuple[str, ...]:
            return tuple(k.partition(":")[2] for k in claims if k.startswith(f"{kind}:"))

        return PluginInfo(
            ep.name,
            version,
            dist_name,
            engines=ids(_lazy.ENGINES),
            thread_stores=ids(_lazy.THREAD_STORES),
            tools=tuple(declared.of(_lazy.TOOLS)),
            commands=ids(_lazy.COMMANDS),
            imported=False,
            summary=summary,
        )

    # --- lazy loading (what the registry's views call) ----------------------------------------

    def _table(self, kind: str) -> dict[str, Any]:
        tables: dict[str, dict[str, Any]] = {
            _lazy.ENGINES: self._engines,
            _lazy.THREAD_STORES: self._factories,
            _lazy.TOOLS: self._tools,
            _lazy.COMMANDS: self._commands,
            _lazy.TOOL_CONFLICTS: self._tool_conflicts,
        }
        return tables[kind]

    def _pending_ids(self, kind: str) -> list[str]:
        if kind == _lazy.TOOLS:
            return [n for _, d in self._pending.values() for n in d.of(_lazy.TOOLS)]
        prefix = f"{kind}:"
        return [k[len(prefix) :] for k in self._reserved if k.startswith(prefix)]

    def _load_for(self, kind: str, id: str) -> None:
        owner = self._reserved.get(f"{kind}:{id}")
        if owner is not None:
            self._load_pending(owner)
        elif kind in (_lazy.TOOLS, _lazy.TOOL_CONFLICTS):
            self._load_kind(kind)

    def _load_kind(self, kind: str | None) -> None:
        """Import every pending plugin that declares ``kind`` (None: every one)."""
        if kind == _lazy.TOOL_CONFLICTS:
            kind = _lazy.TOOLS
        for name, (_, declared) in list(self._pending.items()):
            if kind is None or declared.has(kind):
                self._load_pending(name)

    def _has_pending(self, kind: str) -> bool:
        return any(declared.has(kind) for _, declared in self._pending.values())

    def _load_pending(self, name: str) -> None:
        with self._lock:
            found = self._pending.pop(name, None)
            if found is None:
                return  # imported meanwhile (another thread), or never lazy
            for key in [k for k, owner in self._reserved.items() if owner == name]:
                del self._reserved[key]
                del self._sources[key]
            info = self._load_one(found[0])
            self._plugins[:] = [info if p.name == name else p for p in self._plugins]

    def _failed_owner(self, kind: str, id: str) -> PluginInfo | None:
        """Return the info of the failed plugin that declared ``id``, if one did."""
        key = f"{kind}:{id}"
        for info in self._plugins:
            if info.error is None:
                continue
            declared = self._claims.get(info.name, set())
            if key in declared or (kind == _lazy.TOOLS and f"{_lazy.TOOLS}:*" in declared):
                return info
        return None

    def _load_one(self, ep: importlib.metadata.EntryPoint) -> PluginInfo:
        version, dist_name, _ = distribution_of(ep)
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
        clashes: dict[str, DuplicateRegistrationError] = {}

        def report(id: str, error: BaseException | str) -> None:
            if isinstance(error, DuplicateRegistrationError) and error.kind == "tool":
                clashes[error.id] = error  # a name two of its sources produce (MCP servers)
            else:
                misconfigured[str(id)] = reason_of(error, self._locate)

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
            reason = reason_of(exc, self._locate)
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
        for clash in clashes.values():
            self._tools.pop(clash.id, None)
            self._tool_conflicts.setdefault(clash.id, clash)
        self._observers.extend(observers)
        return PluginInfo(
            name,
            version,
            distribution,
            hook_names,
            tuple(engine_id(e) for e in engines),
            tuple(factory_id(f) for f in factories),
            tools=tuple(t.name for t in tools) + tuple(clashes),
            misconfigured=MappingProxyType(dict(misconfigured)),
            observers=len(observers),
            commands=tuple(c.name for c in commands),
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

    def _note_misconfigured(self, plugin: str, found: Mapping[str, str]) -> None:
        for id, reason in found.items():
            self._misconfigured.setdefault(id, (plugin, reason))

    def build(self) -> ExtensionRegistry:
        """Return an immutable registry of everything registered so far.

        With lazy plugins pending, the registry gets a copy of this builder that imports
        them on use (this builder stays as it is).
        """
        if self._pending:
            return lazy_registry(self._copy())
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

    def _copy(self) -> ExtensionRegistryBuilder:
        copy = ExtensionRegistryBuilder(check_only=self._check_only, locate=self._locate)
        copy._settings = self._settings
        for name in (
            "_misconfigured", "_engines", "_factories", "_tools", "_tool_conflicts",
            "_commands", "_sources", "_pending", "_claims", "_reserved",
        ):  # fmt: skip
            setattr(copy, name, dict(getattr(self, name)))
        copy._plugins = list(self._plugins)
        copy._observers = list(self._observers)
        return copy


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
