"""Roder's stable plugin API: types, hookspecs, the registry, errors and conformance kits.

A plugin needs one import, ``from roder_api import hookimpl``; see ``docs/plugin-hooks.md``.
The registry names and :mod:`roder_api.codec` are imported on first use (PEP 562), so that
``import roder_api`` costs the markers alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from roder_api._markers import hookimpl, hookspec

if TYPE_CHECKING:
    from roder_api import codec as codec
    from roder_api.extension import ExtensionRegistry, ExtensionRegistryBuilder, PluginInfo

__version__ = "0.1.0"

__all__ = [
    "ExtensionRegistry",
    "ExtensionRegistryBuilder",
    "PluginInfo",
    "__version__",
    "hookimpl",
    "hookspec",
]

_LAZY = {
    "ExtensionRegistry": "roder_api.extension",
    "ExtensionRegistryBuilder": "roder_api.extension",
    "PluginInfo": "roder_api.extension",
    "codec": "roder_api.codec",
}


def __getattr__(name: str) -> Any:
    """Import a lazily re-exported name on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'roder_api' has no attribute {name!r}")
    value = importlib.import_module(module)
    if name != "codec":
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
