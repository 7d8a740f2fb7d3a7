"""Fixtures for the roder-otel tests: anyio backends."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and trio."""
    return str(request.param)
