"""``roder threads delete`` and ``prune`` in another process than the session holding a
thread: the delete is refused naming the holder, prune keeps that thread and says so."""

from __future__ import annotations

import functools
import json
import subprocess

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime

from ._cli_store import Seed, seed, store_base
from .test_cli import roder

pytestmark = pytest.mark.anyio


async def roder_in_thread(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``roder`` in a worker thread, so the event loop (and its session) goes on."""
    return await anyio.to_thread.run_sync(functools.partial(roder, *args, env=env, check=False))


async def test_a_thread_a_session_holds_is_neither_deleted_nor_pruned(
    cli_env: dict[str, str],
) -> None:
    seeds = (Seed("held", age_days=40), Seed("idle", age_days=40), Seed("fresh"))
    await anyio.to_thread.run_sync(seed, cli_env, *seeds)  # seed runs an event loop of its own
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=store_base(cli_env)))
    async with Runtime(builder.build()) as runtime:
        async with runtime.start_session("held", owner="a test session"):
            delete = await roder_in_thread("threads", "delete", "held", "--yes", env=cli_env)
            assert delete.returncode == 1, delete.stderr
            assert "thread 'held' is in use by a test session (pid" in delete.stderr
            prune = await roder_in_thread(
                "threads", "prune", "--older-than", "30d", "--yes", "--json", env=cli_env
            )
            assert prune.returncode == 0, prune.stderr
            assert [t["thread_id"] for t in json.loads(prune.stdout)["threads"]] == ["idle"]
            assert "roder: kept held: thread 'held' is in use by a test session" in prune.stderr
        assert {m.thread_id for m in (await runtime.list_threads()).threads} == {"held", "fresh"}
    deleted = await roder_in_thread("threads", "delete", "held", "--yes", "--json", env=cli_env)
    assert deleted.returncode == 0 and json.loads(deleted.stdout) == {"deleted": ["held"]}
