"""``examples/serve_client.py`` against a real ``roder serve``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from serve_support import Server

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "serve_client.py"


def test_example_client_streams_and_resumes(serve: Callable[..., Server]) -> None:
    server = serve()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), server.url, "one two three four five six seven"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "You said: one two three four five six seven" in out.replace("\n", "")
    assert "[turn_complete]" in out and "status: completed" in out
