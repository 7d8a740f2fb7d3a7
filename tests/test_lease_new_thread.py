"""A new thread's lease and create in one worker call (the kit's stores with file leases).

``Runtime.start_session(create=True)`` makes its thread with ``lease_new_thread``; on the
JSONL and SQLite stores the file lock and the create are one worker call (one hand-off to a
worker thread and back), where taking the lease first was a call of its own. Real stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roder_api.events import ItemCompleted
from roder_api.storekit import BlockingThreadStore
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


@pytest.fixture(params=["jsonl", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    factory: Any = (
        JsonlThreadStoreFactory(base_path=tmp_path / "threads")
        if request.param == "jsonl"
        else SqliteThreadStoreFactory(path=tmp_path / "threads.db")
    )
    opened = await factory.open()
    assert isinstance(opened, BlockingThreadStore)
    yield opened
    await opened.aclose()


async def test_the_lease_and_the_create_are_one_worker_call(
    store: BlockingThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    run_sync = store.run_sync

    async def counted(func: Any, *args: Any) -> Any:
        calls.append(getattr(func, "__name__", repr(func)))
        return await run_sync(func, *args)

    monkeypatch.setattr(store, "run_sync", counted)
    first = [ItemCompleted("t1", UserMessage("hello"))]
    async with store.lease_new_thread(ThreadMetadata("made", 1, 1), first, owner="me") as made:
        assert calls == ["lease_and_create"]
        assert [entry.event for entry in made.entries] == first
    # Alone, the same work is two calls: the lease's, then the create's.
    calls.clear()
    async with store.lease("other", owner="me"):
        await store.create_thread_with_events(ThreadMetadata("other", 1, 1), first)
    assert len(calls) >= 1 and "lease_and_create" not in calls
