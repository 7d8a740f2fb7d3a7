"""The ``[temporal]`` table is checked with its file and line; unknown dispatchers are named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from temporal_support import RODER


def _roder(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.toml"
    path.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [str(RODER), "--config", str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_config_check_names_a_bad_temporal_key_with_file_and_line(tmp_path: Path) -> None:
    config = '[temporal]\ntask_queue = "q"\nheartbeat_timeout_s = "soon"\n'
    result = _roder(tmp_path, config, "config", "check")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"{tmp_path / 'config.toml'}:3" in out and "heartbeat_timeout_s" in out, out
    worker = _roder(tmp_path, config, "temporal", "worker")
    assert worker.returncode == 1
    assert "[temporal] heartbeat_timeout_s" in worker.stderr, worker.stderr
    clean = _roder(tmp_path, '[temporal]\ntask_queue = "q"\n', "config", "check")
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_serve_refuses_a_dispatcher_nobody_installed(tmp_path: Path) -> None:
    result = _roder(tmp_path, "", "serve", "--port", "0", "--dispatch", "carrier-pigeon")
    assert result.returncode == 2
    assert "no run dispatcher 'carrier-pigeon'" in result.stderr, result.stderr
    assert "inprocess, temporal" in result.stderr
