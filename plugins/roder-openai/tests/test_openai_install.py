"""roder-openai built and installed into a fresh environment is found by ``roder plugins``."""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

# A pip install into a fresh venv can outlast the default per-test timeout on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PLUGIN = Path(__file__).resolve().parent.parent
REPO = PLUGIN.parent.parent


def test_the_plugin_installs_into_a_fresh_environment(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(REPO),
            str(REPO / "plugins" / "roder-jsonl-thread-store"),
            str(PLUGIN),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path / "home")
    listed = subprocess.run(
        [str(env_dir / "bin" / "roder"), "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["openai"]["engines"] == ["openai", "openai-chat"]
    assert plugins["openai"]["version"] == "0.1.0" and plugins["openai"]["error"] is None
