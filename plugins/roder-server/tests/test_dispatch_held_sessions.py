"""When ``roder serve``'s dispatcher closes a held session: after its idle time.

A session whose recorder failed is ``idle``, so the dispatcher closes it after its idle
time instead of holding it, and the thread's lease, for the process's life (CHANGELOG,
Fixed: a real JSONL store whose appends fail for a while, a full disk say). A session
stays open while requests keep coming (each reuses it: the lease held, the transcript in
memory) and closes ``_IDLE_S`` after the last one, however short each request was (a
request that came and went between two looks at the session used to count as quiet).
The scripted engine, asyncio and trio.
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


def _runtime(path: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    return Runtime(builder.build())


async def test_a_session_whose_store_failed_is_closed_and_its_lease_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runs, "_IDLE_S", 0.5)
    async with _runtime(tmp_path) as runtime:
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


async def test_a_session_stays_open_between_requests_and_closes_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runs, "_IDLE_S", 0.6)
    async with _runtime(tmp_path) as runtime:
        await runtime.create_thread("t")
        dispatcher = Dispatcher(runtime, owner="test")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as task_group:
                await task_group.start(dispatcher.run)
                await dispatcher.submit("t", "first")
                held = dispatcher.local_session("t")
                assert held is not None
                for index in range(8):  # 2.4 s of requests, 0.3 s apart: never 0.6 s quiet
                    await anyio.sleep(0.3)
                    assert dispatcher.local_session("t") is held, f"closed before request {index}"
                    await dispatcher.submit("t", f"more {index}")
                last = anyio.current_time()
                while dispatcher.local_session("t") is not None:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
                quiet = anyio.current_time() - last
                assert 0.55 <= quiet < 1.5, f"closed {quiet:.2f} s after the last request"
                task_group.cancel_scope.cancel()
