"""The docs cannot drift from the code: every hook's exact signature is documented."""

from __future__ import annotations

import inspect

from roder_api import hookspecs

from .conftest import REPO


def hook_functions() -> list[tuple[str, inspect.Signature]]:
    return [
        (name, inspect.signature(func))
        for name, func in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(func, "roder_spec")
    ]


def test_every_hook_is_documented_with_its_signature() -> None:
    doc = (REPO / "docs" / "plugin-hooks.md").read_text()
    hooks = hook_functions()
    assert hooks, "no hookspecs found"
    for name, signature in hooks:
        params = ", ".join(signature.parameters)
        assert f"## {name}({params})" in doc, f"hook {name}({params}) is not documented"
        assert hookspecs.__dict__[name].__doc__
