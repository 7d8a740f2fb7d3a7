"""Fixtures for the roder-otel tests: anyio backends and a loopback OTLP/HTTP receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from otel_collector import CollectorServer, serving


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and trio."""
    return str(request.param)


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    """Return a running OTLP/HTTP receiver (``.endpoint``, ``.spans()``, ``.metrics``)."""
    yield from serving()
