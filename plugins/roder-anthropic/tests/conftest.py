"""Fixtures for the roder-anthropic tests: anyio backends and the loopback server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from anthropic_loopback import KEY_ENV, TEST_KEY, LoopbackServer, running_server


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under trio."""
    return str(request.param)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    """Return a loopback server on 127.0.0.1, stopped after the test."""
    yield from running_server()


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """Set the test key in its environment variable; return it."""
    monkeypatch.setenv(KEY_ENV, TEST_KEY)
    return TEST_KEY
