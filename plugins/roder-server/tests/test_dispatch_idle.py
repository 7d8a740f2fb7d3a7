"""A held session closes after its idle time counted from its last request.

``roder serve``'s dispatcher keeps a thread's session open while requests keep coming
(each reuses it: the lease held, the transcript in memory) and closes it ``_IDLE_S`` after
the last one, however short each request was (a request that came and went between two
looks at the session used to count as quiet). A real JSONL store, the scripted engine,
asyncio and trio.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime
from roder_server import _runs
from roder_server._runs import Dispatcher

pytestmark = pytest.mark.anyio


async def test_a_session_stays_open_between_requests_and_closes_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runs, "_IDLE_S", 0.6)
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path))
    async with Runtime(builder.build()) as runtime:
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
