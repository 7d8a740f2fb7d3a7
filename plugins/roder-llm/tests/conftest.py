"""Fixtures for the roder-llm tests: anyio backends and a private llm home."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio (async llm models) and trio (sync ones, in a thread)."""
    return str(request.param)


@pytest.fixture(autouse=True)
def llm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point llm at a fresh user directory (its keys and default model) for each test."""
    home = tmp_path / "llm-home"
    home.mkdir()
    monkeypatch.setenv("LLM_USER_PATH", str(home))
    monkeypatch.delenv("LLM_ECHO_NEEDS_KEY_KEY", raising=False)
    yield home
