"""The SQLite and PostgreSQL stores, built as distributions of their own, install and load."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

from .conftest import REPO

# A pip install into a fresh venv can outlast the default per-test timeout on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_store_plugins_install_into_a_fresh_environment(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    install = subprocess.run(
        [
            str(env_dir / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(REPO / "packages" / "roder-api"),
            str(REPO),
            str(REPO / "plugins" / "roder-jsonl-thread-store"),
            str(REPO / "plugins" / "roder-sqlite-thread-store"),
            str(REPO / "plugins" / "roder-postgres-thread-store"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    roder = str(env_dir / "bin" / "roder")
    listed = subprocess.run(
        [roder, "plugins", "--json"], capture_output=True, text=True, env=cli_env, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    assert plugins["sqlite"]["thread_stores"] == ["sqlite"]
    assert plugins["postgres"]["thread_stores"] == ["postgres"]
    assert plugins["sqlite"]["error"] is None and plugins["postgres"]["error"] is None
    # Switching the store is configuration only.
    cli_env["RODER_THREAD_STORE"] = "sqlite"
    chat = subprocess.run(
        [roder, "chat"],
        input="hello sqlite\n",
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stderr
    assert "You said: hello sqlite" in chat.stdout
    assert (Path(cli_env["RODER_HOME"]) / "threads.sqlite3").exists()
