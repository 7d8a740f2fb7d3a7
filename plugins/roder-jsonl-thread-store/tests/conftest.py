"""Fixtures shared by the JSONL store's tests: both anyio backends, a factory in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_jsonl_thread_store import JsonlThreadStoreFactory


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under trio."""
    return str(request.param)


@pytest.fixture
def factory(tmp_path: Path) -> JsonlThreadStoreFactory:
    """Return a JSONL store factory in a fresh directory."""
    return JsonlThreadStoreFactory(base_path=tmp_path / "store")
