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
