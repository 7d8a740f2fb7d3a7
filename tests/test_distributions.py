"""The distributions and how they depend on each other, read from every ``pyproject.toml``.

roder-api is the plugin API on its own; every plugin depends on it and never on roder;
roder depends on roder-api and the JSONL store; nothing depends back (no cycle).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .conftest import REPO

pytestmark = pytest.mark.core

# Every distribution of the clone: roder (the root), packages/*, plugins/*, examples/*.
PYPROJECTS = [
    REPO / "pyproject.toml",
    *sorted(REPO.glob("packages/*/pyproject.toml")),
    *sorted(REPO.glob("plugins/*/pyproject.toml")),
    *sorted(REPO.glob("examples/*/pyproject.toml")),
]
PLUGINS = [p for p in PYPROJECTS if p.parent.parent.name in ("plugins", "examples")]


def project(path: Path) -> dict[str, Any]:
    """Return the ``[project]`` table of a pyproject."""
    table: dict[str, Any] = tomllib.loads(path.read_text())["project"]
    return table


def canonical(name: str) -> str:
    """Return a distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """Return the distribution a PEP 508 requirement names (no extras, versions, markers)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match is not None, requirement
    return canonical(match.group(1))


def dependency_graph() -> dict[str, set[str]]:
    """Return each distribution of the clone with the clone's distributions it requires."""
    ours = {canonical(project(p)["name"]): p for p in PYPROJECTS}
    return {
        name: {
            dep
            for dep in map(requirement_name, project(path).get("dependencies", []))
            if dep in ours
        }
        for name, path in ours.items()
    }


def cycle_from(graph: dict[str, set[str]]) -> list[str]:
    """Return one dependency cycle of ``graph`` (as a path that ends where it starts), or []."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        for target in sorted(graph[node]):
            found = walk(target, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = walk(start, [])
        if found:
            return found
    return []


def test_every_distribution_of_the_clone_is_read() -> None:
    names = {canonical(project(p)["name"]) for p in PYPROJECTS}
    assert {"roder", "roder-api", "roder-jsonl-thread-store", "roder-echo-engine"} <= names
    assert len(names) == len(PYPROJECTS), "two pyprojects name the same distribution"


def test_no_cycle_between_distributions() -> None:
    graph = dependency_graph()
    assert graph["roder"] >= {"roder-api", "roder-jsonl-thread-store"}
    assert cycle_from(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: p.parent.name)
def test_each_plugin_depends_on_roder_api_and_not_on_roder(path: Path) -> None:
    names = {requirement_name(r) for r in project(path).get("dependencies", [])}
    assert "roder-api" in names, f"{path.parent.name} must depend on roder-api"
    assert "roder" not in names, f"{path.parent.name} depends on roder; it needs roder-api only"


def test_roder_api_depends_on_pluggy_orjson_and_anyio_only() -> None:
    api = project(REPO / "packages" / "roder-api" / "pyproject.toml")
    assert sorted(map(requirement_name, api["dependencies"])) == ["anyio", "orjson", "pluggy"]
    # What roder_api imports beyond them is an extra, imported only on its own path.
    assert set(api["optional-dependencies"]) == {"tools", "httpx", "testing"}


def top_level_packages(path: Path) -> dict[str, Path]:
    """Return the import packages a distribution's wheel holds, by name, with their source."""
    setuptools = tomllib.loads(path.read_text()).get("tool", {}).get("setuptools", {})
    find = setuptools.get("packages", {}).get("find", {})
    found: dict[str, Path] = {}
    for where in find.get("where", ["."]):
        root = path.parent / where
        for init in sorted(root.glob("*/__init__.py")):
            name = init.parent.name
            include = find.get("include")
            if include is None or name in include:
                found[name] = init.parent.resolve()
    return found


def test_no_package_belongs_to_two_distributions() -> None:
    owners: dict[str, list[str]] = {}
    for path in PYPROJECTS:
        for package in top_level_packages(path):
            owners.setdefault(package, []).append(project(path)["name"])
    assert owners["roder_api"] == ["roder-api"] and owners["roder_runtime"] == ["roder"]
    assert {p: names for p, names in owners.items() if len(names) > 1} == {}


def test_the_version_of_roder_and_roder_api_is_written_once() -> None:
    import roder_api
    import roder_runtime

    api_path = REPO / "packages" / "roder-api" / "pyproject.toml"
    for path in (REPO / "pyproject.toml", api_path):
        table = tomllib.loads(path.read_text())
        assert "version" not in table["project"] and table["project"]["dynamic"] == ["version"]
        assert table["tool"]["setuptools"]["dynamic"]["version"] == {
            "attr": "roder_api.__version__"
        }
    assert roder_runtime.__version__ == roder_api.__version__
    source = (REPO / "packages" / "roder-api" / "src" / "roder_api" / "__init__.py").read_text()
    assert f'__version__ = "{roder_api.__version__}"' in source


def _python(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_roder_api_imports_none_of_its_extras_nor_roder() -> None:
    # Plugins import these; none may pull in an extra (or the runtime) just by being imported.
    done = _python(
        "import sys\n"
        "import roder_api, roder_api.tools, roder_api.threads, roder_api.storekit\n"
        "import roder_api.enginekit, roder_api.inference, roder_api.transcript\n"
        "import roder_api.codec, roder_api.errors, roder_api.events, roder_api.extension\n"
        "heavy = ('pydantic', 'jsonschema', 'docstring_parser', 'httpx', 'pytest',\n"
        "         'roder_runtime')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_tool_without_the_tools_extra_says_which_extra_to_install() -> None:
    # sys.modules[name] = None is how an uninstalled module looks to an import.
    done = _python(
        "import sys\n"
        "sys.modules['pydantic'] = None\n"
        "from roder_api.tools import tool\n"
        "def words(text: str) -> int:\n"
        "    return len(text.split())\n"
        "try:\n"
        "    tool(words)\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error.name, '|', error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pydantic | "), done.stdout
    assert "pip install 'roder-api[tools]'" in done.stdout


@pytest.mark.slow
def test_a_wheel_built_from_roders_sdist_has_roder_apis_version(tmp_path: Path) -> None:
    # The version lives in roder-api's tree: roder's sdist must carry it (MANIFEST.in).
    import roder_api

    built = _python(
        f"from setuptools.build_meta import build_sdist\nprint(build_sdist({str(tmp_path)!r}))\n"
    )
    assert built.returncode == 0, built.stderr
    sdist = tmp_path / built.stdout.strip().splitlines()[-1]
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["-w", str(tmp_path / "wheels"), str(sdist)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert wheel.returncode == 0, wheel.stderr
    names = [p.name for p in (tmp_path / "wheels").glob("*.whl")]
    assert names == [f"roder-{roder_api.__version__}-py3-none-any.whl"]
