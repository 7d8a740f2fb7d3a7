"""PEP 562 re-exports: a package's public names imported when first used."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for module ``package`` (PEP 562).

    ``table`` maps each lazily re-exported name to the module that defines it; a name that
    is the last part of its module's name (``"codec": "roder_api.codec"``) is that module.
    The first use imports the module and keeps the value in the package, so later uses are
    plain attribute reads; ``dir()`` lists the names before they are imported. Use it as::

        __getattr__, __dir__ = lazy_exports(__name__, {"Runtime": "roder_runtime._runtime"})
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        source = table.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value: Any = importlib.import_module(source)
        if source.rpartition(".")[2] != name:
            value = getattr(value, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
