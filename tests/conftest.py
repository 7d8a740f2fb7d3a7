"""Shared fixtures: anyio backends (asyncio and trio), stores in ``tmp_path``, runtimes."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

from .installed_roder import Installed, install

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every async test under asyncio and under trio."""
    return str(request.param)


@pytest.fixture
def jsonl_factory(tmp_path: Path) -> JsonlThreadStoreFactory:
    """Return a JSONL store factory in a fresh directory."""
    return JsonlThreadStoreFactory(base_path=tmp_path / "threads")


@pytest.fixture
async def jsonl_store(jsonl_factory: JsonlThreadStoreFactory) -> AsyncIterator[JsonlThreadStore]:
    """Return an open JSONL store, closed after the test."""
    store = await jsonl_factory.open()
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def engine() -> ScriptedEngine:
    """Return a fresh scripted engine."""
    return ScriptedEngine()


def make_runtime(
    base: Path, *engines: ScriptedEngine, config: RuntimeConfig | None = None
) -> Runtime:
    """Return a runtime on a JSONL store at ``base`` with the given engines."""
    builder = ExtensionRegistryBuilder()
    for engine in engines or (ScriptedEngine(),):
        builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    return Runtime(builder.build(), config or RuntimeConfig())


@pytest.fixture
async def runtime(tmp_path: Path, engine: ScriptedEngine) -> AsyncIterator[Runtime]:
    """Return a runtime on a JSONL store in ``tmp_path`` with the scripted engine."""
    rt = make_runtime(tmp_path / "threads", engine)
    try:
        yield rt
    finally:
        await rt.aclose()


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Return an environment for ``roder`` subprocesses with ``RODER_HOME`` in ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    yield env


def roder_command() -> list[str]:
    """Return the command that runs ``roder`` with this interpreter."""
    return [sys.executable, "-m", "roder_runtime"]


@pytest.fixture(scope="session")
def installed_roder(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Return roder installed the README's way into a fresh venv (built once per session)."""
    return install(tmp_path_factory.mktemp("installed"))
