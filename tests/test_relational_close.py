"""RelationalThreadStore runs its group commit on the store kit's workers and closes cleanly.

The store kit's worker pool (``roder-store-worker``) is the process's, shared by every
store, and outlives any one of them by design: it is not the store's to end. A store starts
no thread of its own (the group commit's batches run on that pool too).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from roder_api.errors import StoppedError
from roder_api.testing.conformance import make_metadata, user_item
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_the_relational_store_starts_no_thread_of_its_own(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = await SqliteThreadStoreFactory(tmp_path / "threads.sqlite3").open()
    await store.create_thread(make_metadata("one"))
    await store.append_events("one", [user_item("hi")])  # through the group commit
    started = [t for t in threading.enumerate() if t not in before]
    # No committer thread, no anyio.to_thread worker: only the kit's pool (the test
    # runner's own threads, such as trio's, are not the store's).
    assert {t.name for t in started if not t.name.startswith("Trio")} <= {"roder-store-worker"}
    await store.aclose()
    with pytest.raises(StoppedError):
        await store.append_events("one", [user_item("again")])
    own = [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("roder-") and t.name != "roder-store-worker"
    ]
    assert [t.name for t in own if t.is_alive()] == []
