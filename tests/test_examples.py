"""Every example script runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import REPO


def test_quickstart_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "quickstart.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "assistant: You said: Hello, Roder!" in result.stdout
    assert "after a restart: 4 items" in result.stdout
    assert list((tmp_path / "threads").glob("*.jsonl"))


def test_agent_with_tools_runs_a_multi_step_task(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("one two\n")
    (folder / "b.txt").write_text("one two three four five six seven\n")
    script = str(REPO / "examples" / "agent_with_tools.py")
    result = subprocess.run(
        [sys.executable, script, str(folder), "--threads", str(tmp_path / "threads")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("  -> list_files(") and lines[3].startswith("  -> count_words(")
    assert lines[-1] == "assistant: The largest is b.txt (34 bytes): 7 words."
    assert list((tmp_path / "threads").rglob("*.jsonl"))


def test_agent_with_tools_runs_on_a_configured_engine(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    home = Path(cli_env["RODER_HOME"])
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f'[thread_store]\npath = "{tmp_path / "threads"}"\n')
    script = str(REPO / "examples" / "agent_with_tools.py")
    result = subprocess.run(
        [sys.executable, script, str(tmp_path), "--engine", "scripted"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**cli_env, "RODER_PLUGINS": "jsonl,scripted"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("assistant: You said: Which is the largest")
