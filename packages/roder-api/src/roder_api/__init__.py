"""Roder's stable plugin API: types, hookspecs, the registry, errors and conformance kits.

A plugin needs one import, ``from roder_api import hookimpl``; see ``docs/plugin-hooks.md``.
The registry names and :mod:`roder_api.codec` are imported on first use (PEP 562), so that
``import roder_api`` costs the markers alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api._exports import lazy_exports
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
    "lazy_exports",
]

_LAZY = {
    "ExtensionRegistry": "roder_api.extension",
    "ExtensionRegistryBuilder": "roder_api.extension",
    "PluginInfo": "roder_api.extension",
    "codec": "roder_api.codec",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
