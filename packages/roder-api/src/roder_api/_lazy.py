"""Lazy plugins: what a plugin declares it provides, and registry views that import on use.

A plugin may list what it registers in entry-point groups next to its ``roder`` entry point
(each entry's name is an id, its value the plugin's module, the same string as the
``roder`` entry point's value)::

    [project.entry-points."roder.engines"]        # engine ids
    [project.entry-points."roder.engine_types"]   # `type`s an [engines.X] table may name
    [project.entry-points."roder.thread_stores"]  # store ids
    [project.entry-points."roder.tools"]          # tool names, or "*": known when it runs
    [project.entry-points."roder.commands"]       # `roder` sub-command names
    [project.entry-points."roder.observers"]      # any name: it registers observers

Such a plugin is imported only when one of its ids is asked for (tools: when the tools are
needed; observers: when the first batch is journaled). Reading entry points is cheap (the
installed metadata); importing a plugin is not (its SDKs, a server it starts). A plugin that
declares nothing is imported when the registry is built, as before.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from roder_api._markers import PROJECT_NAME

if TYPE_CHECKING:  # annotations only: _registry imports this module
    from roder_api._registry import PluginInfo
    from roder_api.observers import Observer

ENGINES = "inference engine"
ENGINE_TYPES = "engine type"
THREAD_STORES = "thread store"
TOOLS = "tool"
COMMANDS = "command"
OBSERVERS = "observer"
TOOL_CONFLICTS = "tool conflict"

CLAIMED = (ENGINES, THREAD_STORES, COMMANDS)
"""The kinds whose declared ids are reserved: another plugin's registration of one is a
duplicate. (Tool names clash as conflicts when the tools are loaded, as without laziness.)"""

DECLARATION_GROUPS = {
    f"{PROJECT_NAME}.engines": ENGINES,
    f"{PROJECT_NAME}.engine_types": ENGINE_TYPES,
    f"{PROJECT_NAME}.thread_stores": THREAD_STORES,
    f"{PROJECT_NAME}.tools": TOOLS,
    f"{PROJECT_NAME}.commands": COMMANDS,
    f"{PROJECT_NAME}.observers": OBSERVERS,
}
"""Entry-point group -> the kind of registration its names declare."""

ANY_NAME = "*"
"""A ``roder.tools`` name that says: its tool names are known only once it runs (MCP)."""


@dataclass
class Declared:
    """What one plugin module declares it registers, by kind (ids in entry-point order)."""

    ids: dict[str, list[str]] = field(default_factory=dict)

    def of(self, kind: str) -> list[str]:
        """Return the ids declared for ``kind`` (``*`` left out)."""
        return [i for i in self.ids.get(kind, ()) if i != ANY_NAME]

    def has(self, kind: str) -> bool:
        """Return True when anything (``*`` included) is declared for ``kind``."""
        return bool(self.ids.get(kind))


def read_declarations(entry_points: Iterable[importlib.metadata.EntryPoint]) -> dict[str, Declared]:
    """Return each plugin module's declarations (keyed by the entry points' value)."""
    found: dict[str, Declared] = {}
    for ep in entry_points:
        kind = DECLARATION_GROUPS.get(ep.group)
        if kind is None:
            continue
        ids = found.setdefault(ep.value, Declared()).ids.setdefault(kind, [])
        if ep.name not in ids:
            ids.append(ep.name)
    return found


def is_declaration(ep: importlib.metadata.EntryPoint) -> bool:
    """Return True for an entry point of a declaration group (not a plugin itself)."""
    return ep.group in DECLARATION_GROUPS


class Loader(Protocol):
    """What the views need from the registry's builder: its tables and on-demand imports."""

    _plugins: list[PluginInfo]
    _sources: dict[str, str]
    _misconfigured: dict[str, tuple[str, str]]
    _observers: list[Observer]

    def _has_pending(self, kind: str) -> bool: ...

    def _table(self, kind: str) -> dict[str, Any]: ...

    def _pending_ids(self, kind: str) -> Iterable[str]: ...

    def _load_for(self, kind: str, id: str) -> None: ...

    def _load_kind(self, kind: str | None) -> None: ...

    def _failed_owner(self, kind: str, id: str) -> PluginInfo | None: ...


T = TypeVar("T")


class LazyTable(Mapping[str, T]):
    """A registry table whose declared ids import their plugin when first looked up.

    A value is imported on ``[id]``: only the plugin that declares ``id``. Membership is
    what the plugins really registered, so ``id in table`` imports the one plugin that
    declares ``id`` (a plugin may decline an id it declared: misconfigured, or failing to
    import) — except with ``declared_is_in`` (commands: a command is always registered, so
    ``roder --help`` lists it from the declaration alone). Iterating and ``len`` import
    nothing: they count what is registered and what is declared, so a caller that indexes
    what it iterates uses ``.get(id)`` (a declared id may turn out missing). For a kind whose
    names are only known when the plugins run (tools), every access but a hit on a declared
    name imports the kind's plugins first.
    """

    def __init__(
        self, loader: Loader, kind: str, *, whole_kind: bool = False, declared_is_in: bool = False
    ) -> None:
        self._loader = loader
        self._kind = kind
        self._whole_kind = whole_kind
        self._declared_is_in = declared_is_in

    def _settled(self) -> dict[str, Any]:
        if self._whole_kind:
            self._loader._load_kind(self._kind)
        return self._loader._table(self._kind)

    def __getitem__(self, key: str) -> T:
        table = self._settled()
        if key not in table:
            self._loader._load_for(self._kind, key)
        found: T = table[key]
        return found

    def __contains__(self, key: object) -> bool:
        table = self._loader._table(self._kind)
        if key in table:
            return True
        if isinstance(key, str) and key in list(self._loader._pending_ids(self._kind)):
            if self._declared_is_in:
                return True
            self._loader._load_for(self._kind, key)
            return key in table
        return self._whole_kind and key in self._settled()

    def __iter__(self) -> Iterator[str]:
        table = self._settled()
        return iter([*table, *(i for i in self._loader._pending_ids(self._kind) if i not in table)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"LazyTable({self._kind!r}, {sorted(self)!r})"


class LazyList(Sequence[T]):
    """A registry list (observers) whose plugins are imported when it is first read.

    ``bool()`` answers without importing: True when something is registered or declared.
    ``loaded`` is what is there without importing anything more.
    """

    def __init__(self, items: list[T], pending: Callable[[], bool], load: Callable[[], None]):
        self._items = items
        self._pending = pending
        self._load = load

    @property
    def loaded(self) -> tuple[T, ...]:
        """Return the items registered so far (imports nothing)."""
        return tuple(self._items)

    def __bool__(self) -> bool:
        return bool(self._items) or self._pending()

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        self._load()
        return self._items[index]

    def __len__(self) -> int:
        self._load()
        return len(self._items)

    def __repr__(self) -> str:
        return f"LazyList({self._items!r}, pending={self._pending()})"
