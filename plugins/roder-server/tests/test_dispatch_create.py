"""``Dispatcher.submit(..., create=True)``: a run on a thread the dispatcher creates.

In process, the thread is made as its session opens (``Runtime.start_session(create=
True)``) and the run is answered there; with a remote run dispatcher (``roder serve
--dispatch temporal``) there is no session here: the thread is created, the input
journaled, and the run handed to the remote dispatcher. A taken id is refused either way.
Real JSONL stores, the scripted engine, asyncio and trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import ThreadExistsError
from roder_api.events import InputAccepted, TurnComplete
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime
from roder_server._dispatch import AcceptedRun
from roder_server._runs import Dispatcher

pytestmark = pytest.mark.anyio


class Remote:
    """A remote run dispatcher that only records what it is handed."""

    def __init__(self) -> None:
        self.runs: list[AcceptedRun] = []

    async def dispatch(self, run: AcceptedRun) -> None:
        self.runs.append(run)


def _runtime(path: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    return Runtime(builder.build())


async def _events(runtime: Runtime, thread_id: str) -> list[object]:
    return [e.event for e in (await runtime.event_page(thread_id, limit=1000)).events]


async def _ended(runtime: Runtime, thread_id: str) -> bool:
    return any(isinstance(e, TurnComplete) for e in await _events(runtime, thread_id))


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with _runtime(tmp_path / "threads") as opened:
        yield opened


async def test_in_process_the_thread_is_made_and_the_run_answered_here(runtime: Runtime) -> None:
    dispatcher = Dispatcher(runtime, owner="test")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as task_group:
            await task_group.start(dispatcher.run)
            turn_id, status = await dispatcher.submit("fresh", "hello", create=True)
            assert status == "running"
            assert dispatcher.local_session("fresh") is not None
            while not await _ended(runtime, "fresh"):  # noqa: ASYNC110 - no other signal
                await anyio.sleep(0.02)
            with pytest.raises(ThreadExistsError):
                await dispatcher.submit("fresh", "again", create=True)
            task_group.cancel_scope.cancel()
    ended = [e for e in await _events(runtime, "fresh") if isinstance(e, TurnComplete)]
    assert [e.turn_id for e in ended] == [turn_id]  # the refused run journaled nothing


async def test_with_a_remote_dispatcher_the_thread_is_made_and_the_run_handed_over(
    runtime: Runtime,
) -> None:
    remote = Remote()
    dispatcher = Dispatcher(runtime, owner="test", remote=remote)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as task_group:
            await task_group.start(dispatcher.run)
            turn_id, status = await dispatcher.submit("handed", "hello", create=True)
            with pytest.raises(ThreadExistsError):
                await dispatcher.submit("handed", "again", create=True)
            task_group.cancel_scope.cancel()
    assert status == "queued"
    assert dispatcher.local_session("handed") is None
    events = await _events(runtime, "handed")
    assert len(events) == 1 and isinstance(events[0], InputAccepted)
    assert events[0].turn_id == turn_id
    assert remote.runs == [AcceptedRun("", "handed", turn_id)]
