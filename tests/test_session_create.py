"""A session that opens on a thread it creates (``Runtime.start_session(create=True)``).

The thread is created while the lease is taken, and nothing is read back: the store's
metadata is never asked for before the first turn. A taken id, a refused lease and a
cancelled open each leave the lease free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api.errors import ThreadBusyError, ThreadExistsError, ThreadNotFoundError
from roder_api.events import TurnComplete, TurnStarted
from roder_api.threads import ThreadMetadata
from roder_runtime import UserInput

from .conftest import make_runtime
from .session_support import events_until, journal

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_session_creates_its_thread_and_reads_nothing_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        reads: list[str] = []
        get_thread = store.get_thread

        async def counted(thread_id: str) -> ThreadMetadata:
            reads.append(thread_id)
            return await get_thread(thread_id)

        monkeypatch.setattr(store, "get_thread", counted)
        async with runtime.start_session("fresh", create=True) as session:
            assert reads == []  # created and opened: its metadata is what the create returned
            await session.submit(UserInput("hello"), turn_id="t1")
            await events_until(session, TurnComplete)
        monkeypatch.undo()
        events = await journal(runtime, "fresh")
        assert isinstance(events[0], TurnStarted) and events[0].turn_id == "t1"
        assert isinstance(events[-1], TurnComplete)
        assert (await runtime.get_thread("fresh")).last_sequence == len(events)


async def test_a_taken_id_raises_thread_exists_and_the_lease_stays_free(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        await runtime.create_thread("taken")
        with pytest.raises(ThreadExistsError):
            await runtime.start_session("taken", create=True)
        async with runtime.start_session("taken") as session:  # the lease was released
            await session.submit(UserInput("hi"))
            assert isinstance((await session.next_event()).event, TurnStarted)


async def test_a_refused_lease_raises_busy_and_the_thread_stays_created(tmp_path: Path) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        async with store.lease("held", owner="someone else"):
            with pytest.raises(ThreadBusyError) as refused:
                await runtime.start_session("held", create=True)
            assert refused.value.holder is not None
            assert refused.value.holder.owner == "someone else"
        assert (await runtime.get_thread("held")).last_sequence == 0
        async with runtime.start_session("held") as session:
            await session.submit(UserInput("hi"))
            assert isinstance((await session.next_event()).event, TurnStarted)


async def test_an_open_cancelled_while_creating_leaves_the_lease_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        started = anyio.Event()

        async def stuck(metadata: ThreadMetadata) -> Any:
            started.set()
            await anyio.sleep(60)

        monkeypatch.setattr(store, "create_thread", stuck)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as task_group:

                async def open_it() -> None:
                    await runtime.start_session("slow", create=True)

                task_group.start_soon(open_it)
                await started.wait()
                await anyio.sleep(0.05)  # the lease is taken by now, the create still waits
                task_group.cancel_scope.cancel()
        monkeypatch.undo()
        with pytest.raises(ThreadNotFoundError):
            await runtime.get_thread("slow")
        with anyio.fail_after(10):
            async with store.lease("slow", owner="after"):  # not left held
                pass
