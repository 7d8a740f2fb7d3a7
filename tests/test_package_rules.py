"""Each subpackage of ``roder_runtime`` says in its docstring what it may import, and does
not import anything else (package-level edges, imports that run): the rule cannot drift."""

from __future__ import annotations

import ast
import re

import pytest

from .conftest import REPO
from .test_module_graph import cycles, graph

pytestmark = pytest.mark.core

RUNTIME = REPO / "roder_runtime"
RULE = re.compile(r"^(?:(?P<room>_\w+) )?[Mm]ay import: (?P<rooms>.+)\.$", re.MULTILINE)
NOTHING = "nothing of roder_runtime"


def rooms() -> list[str]:
    """Return the subpackages of ``roder_runtime``."""
    return sorted(p.parent.name for p in RUNTIME.glob("*/__init__.py"))


def room_of(module: str) -> str | None:
    """Return the room a module of ``roder_runtime`` lives in: a subpackage, a top-level
    module (``_runtime``), or ``roder_runtime`` for the package itself."""
    parts = module.split(".")
    if parts[0] != "roder_runtime":
        return None
    if len(parts) == 1:
        return "roder_runtime"
    return parts[1]


def stated_rules() -> dict[str, set[str]]:
    """Return what each room's docstring says it may import."""
    rules: dict[str, set[str]] = {}
    sources = {name: RUNTIME / name / "__init__.py" for name in rooms()}
    sources["roder_runtime"] = RUNTIME / "__init__.py"
    for name, path in sources.items():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        for match in RULE.finditer(docstring):
            room = match["room"] or name
            stated = match["rooms"].strip()
            rules[room] = set() if stated == NOTHING else {r.strip() for r in stated.split(",")}
    return rules


def actual_edges() -> dict[str, set[str]]:
    """Return the rooms each room imports (imports that run; ``TYPE_CHECKING`` ones not)."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        room = room_of(module)
        if room is None:
            continue
        mine = edges.setdefault(room, set())
        for target in targets:
            other = room_of(target)
            if other is not None and other != room:
                mine.add(other)
    return edges


def test_every_subpackage_states_what_it_owns_and_may_import() -> None:
    rules = stated_rules()
    assert set(rooms()) <= set(rules), "a subpackage's docstring has no 'May import:' line"
    for name in rooms():
        path = RUNTIME / name / "__init__.py"
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert docstring.splitlines()[0].strip(), f"{name}: no one-line summary"


@pytest.mark.parametrize("room", [*rooms(), "_runtime"])
def test_a_room_imports_only_what_its_docstring_allows(room: str) -> None:
    allowed = stated_rules()[room]
    assert set(allowed) <= {*rooms(), "_runtime", "roder_runtime"}, "a rule names no room"
    assert actual_edges().get(room, set()) - allowed == set()


def test_the_stated_rules_have_no_cycle() -> None:
    rules = stated_rules()
    edges = {room: {t for t in targets if t in rules} for room, targets in rules.items()}
    assert cycles(edges) == []


def test_the_rule_parser_and_the_room_walk_see_what_they_must() -> None:
    text = "Owns x.\n\nMay import: config, store.\n\n_runtime may import: session."
    found = {m["room"]: m["rooms"] for m in RULE.finditer(text)}
    assert found == {None: "config, store", "_runtime": "session"}
    assert room_of("roder_runtime.turn._driver") == "turn"
    assert room_of("roder_runtime._runtime") == "_runtime"
    assert room_of("roder_api.events") is None
    # The walk is not empty: the turn imports the model (its model call).
    assert "model" in actual_edges()["turn"]
