"""Packaging: every distribution builds, no file belongs to two, the README's command works."""

from __future__ import annotations

import email
import json
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .installed_roder import REPO, Installed, clean_env, run, wheel_files

# The first test builds the venv of the session (slow on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def distributions() -> list[Path]:
    """Return the root (roder), then roder-api and the other packages, then the plugins."""
    return [
        REPO,
        *sorted(p.parent for p in REPO.glob("packages/*/pyproject.toml")),
        *sorted(p.parent for p in REPO.glob("plugins/*/pyproject.toml")),
    ]


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def test_every_distribution_builds_a_wheel_and_no_file_is_in_two(
    installed_roder: Installed,
) -> None:
    wheels = sorted(installed_roder.wheels.glob("*.whl"))
    names = {metadata(w)["Name"] for w in wheels}
    expected = {
        tomllib.loads((d / "pyproject.toml").read_text())["project"]["name"]
        for d in distributions()
    }
    assert names == expected
    owners = Counter(
        path for wheel in wheels for path in wheel_files(wheel) if ".dist-info/" not in path
    )
    assert [path for path, n in owners.items() if n > 1] == []
    jsonl_owners = [
        w.name
        for w in wheels
        if any(p.startswith("roder_jsonl_thread_store/") for p in wheel_files(w))
    ]
    assert len(jsonl_owners) == 1 and jsonl_owners[0].startswith("roder_jsonl_thread_store-")


def test_every_wheel_carries_what_a_package_index_expects(installed_roder: Installed) -> None:
    for wheel in sorted(installed_roder.wheels.glob("*.whl")):
        meta = metadata(wheel)
        assert meta["License-Expression"] == "MIT", wheel.name
        assert any(p.endswith(".dist-info/licenses/LICENSE") for p in wheel_files(wheel)), (
            wheel.name
        )
        classifiers = meta.get_all("Classifier") or []
        assert "Programming Language :: Python :: 3" in classifiers, wheel.name
        # No project URLs until the project has a public home (test_install_metadata.py).
        assert not meta.get_all("Project-URL"), wheel.name
        assert meta["Requires-Python"] == ">=3.10", wheel.name


def test_build_requirements_are_what_license_expressions_need() -> None:
    for dist in distributions():
        requires = tomllib.loads((dist / "pyproject.toml").read_text())["build-system"]["requires"]
        assert requires == ["setuptools>=77"], dist


def test_versions_are_written_once_per_distribution(installed_roder: Installed) -> None:
    import roder_api
    import roder_runtime

    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in root and root["dynamic"] == ["version"]
    assert roder_runtime.__version__ == roder_api.__version__
    roder_wheel = next(installed_roder.wheels.glob("roder-*.whl"))
    assert metadata(roder_wheel)["Version"] == roder_api.__version__
    api_wheel = next(installed_roder.wheels.glob("roder_api-*.whl"))
    assert metadata(api_wheel)["Version"] == roder_api.__version__


def test_the_readme_command_installs_roder_with_every_plugin_and_chats(
    installed_roder: Installed, tmp_path: Path
) -> None:
    result = installed_roder.readme_result
    assert result.returncode == 0, result.stderr
    env = clean_env(tmp_path / "home")
    listed = run(installed_roder, "plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    for dist in distributions()[1:]:
        if dist.parent.name != "plugins":
            continue
        entry_points = tomllib.loads((dist / "pyproject.toml").read_text())["project"][
            "entry-points"
        ]["roder"]
        for name in entry_points:
            assert plugins[name]["error"] is None, plugins[name]
    assert plugins["jsonl"]["thread_stores"] == ["jsonl"]
    chat = run(installed_roder, "chat", env=env, stdin="hello from a fresh venv\n")
    assert chat.returncode == 0, chat.stderr
    assert "You said: hello from a fresh venv" in chat.stdout
    # Every plugin is imported from the venv, not from the clone or the test's environment.
    where = run(
        installed_roder,
        "--version",
        env=env,
    )
    assert where.returncode == 0 and where.stdout.startswith("roder ")


def test_uninstalling_a_plugin_leaves_roder_and_its_store(
    installed_roder: Installed, tmp_path: Path
) -> None:
    import subprocess

    venv = tmp_path / "venv"
    subprocess.run(
        ["python3", "-m", "venv", str(venv)], check=True, timeout=120, capture_output=True
    )
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps"]
    wheels = sorted(str(w) for w in installed_roder.wheels.glob("*.whl"))
    subprocess.run([*pip, *wheels], check=True, timeout=300, capture_output=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "uninstall",
            "--quiet",
            "-y",
            "roder-sqlite-thread-store",
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    site = next((venv / "lib").glob("python*/site-packages"))
    assert (site / "roder_jsonl_thread_store" / "_store.py").is_file()
    assert not (site / "roder_sqlite_thread_store").exists()
