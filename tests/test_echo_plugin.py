"""A third-party plugin built as its own distribution is found with no code change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .conftest import REPO

# A pip install into a fresh venv can outlast the default per-test timeout on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_echo_plugin_installs_into_a_fresh_environment(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
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
            str(REPO / "packages" / "roder-api"),
            str(REPO),
            str(REPO / "plugins" / "roder-jsonl-thread-store"),
            str(REPO / "examples" / "roder-echo-engine"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    roder = env_dir / "bin" / "roder"
    listed = subprocess.run(
        [str(roder), "plugins", "--json"], capture_output=True, text=True, env=cli_env, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["echo"]["engines"] == ["echo"] and plugins["echo"]["version"] == "0.1.0"
    assert {"jsonl", "scripted"} <= set(plugins)
    chat = subprocess.run(
        [str(roder), "chat", "--engine", "echo"],
        input="hello plugin\n",
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stderr
    assert "echo: hello plugin" in chat.stdout
    assert chat.stderr.startswith("thread: ")
    # The plugin's import does not leak into this interpreter's environment.
    assert "roder_echo_engine" not in sys.modules
    assert os.path.exists(env_dir / "bin" / "roder")
