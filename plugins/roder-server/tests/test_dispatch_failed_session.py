"""A held session whose store failed is closed by the dispatcher, and its lease freed.

CHANGELOG (Fixed): a session whose recorder failed is ``idle``, so ``roder serve``'s
dispatcher closes it after its idle time instead of holding it, and the thread's lease,
for the process's life. A real JSONL store whose appends fail for a while (a full disk,
say), the scripted engine, asyncio and trio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import StoreError
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime
from roder_server import _runs
from roder_server._problems import Problem
from roder_server._runs import Dispatcher

pytestmark = pytest.mark.anyio


async def test_a_session_whose_store_failed_is_closed_and_its_lease_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runs, "_IDLE_S", 0.5)
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path))
    async with Runtime(builder.build()) as runtime:
        await runtime.create_thread("t")
        store = await runtime.store()
        append = store.append_events
        failing = [True]

        async def append_or_fail(thread_id: str, events: Any, **kwargs: Any) -> Any:
            if failing[0]:
                raise StoreError("the disk is full")
            return await append(thread_id, events, **kwargs)

        monkeypatch.setattr(store, "append_events", append_or_fail)
        dispatcher = Dispatcher(runtime, owner="test")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as task_group:
                await task_group.start(dispatcher.run)
                with pytest.raises((StoreError, Problem)):
                    await dispatcher.submit("t", "hello")
                assert dispatcher.local_session("t") is not None  # held, failed
                failing[0] = False
                with anyio.fail_after(20):  # its idle time is 0.5 s here
                    while dispatcher.local_session("t") is not None:  # noqa: ASYNC110
                        await anyio.sleep(0.05)  # closed: not held for life
                async with store.lease("t", owner="after"):  # its lease was freed
                    pass
                _, status = await dispatcher.submit("t", "again")  # a new session answers
                assert status == "running"
                task_group.cancel_scope.cancel()
