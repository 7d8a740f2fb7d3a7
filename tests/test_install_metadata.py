"""Distribution metadata that needs no build: what every ``pyproject.toml`` says about us."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .conftest import REPO

# The root's, the plugins' and the examples' (no deeper: .venv holds others' of its own).
PYPROJECTS = sorted(
    p
    for pattern in ("pyproject.toml", "*/pyproject.toml", "*/*/pyproject.toml")
    for p in REPO.glob(pattern)
    if not p.relative_to(REPO).parts[0].startswith((".", "build"))
)


def test_every_pyproject_is_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in PYPROJECTS}
    assert "pyproject.toml" in names and "plugins/roder-openai/pyproject.toml" in names
    assert "examples/roder-echo-engine/pyproject.toml" in names


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: p.parent.relative_to(REPO).as_posix())
def test_no_distribution_names_a_project_url(path: Path) -> None:
    # The project has no public home yet: an address made up for it would send people to a
    # repository that does not exist (or is somebody else's). Add URLs once there is one.
    project = tomllib.loads(path.read_text())["project"]
    assert "urls" not in project, f"{path}: [project.urls] names addresses the project lacks"
