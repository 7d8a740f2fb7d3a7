"""Roder's stable plugin API: types, hookspecs, the registry, errors and conformance kits.

A plugin needs one import, ``from roder_api import hookimpl``; see ``docs/plugin-hooks.md``.
"""

from __future__ import annotations

from roder_api import codec as codec
from roder_api._markers import hookimpl, hookspec
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
