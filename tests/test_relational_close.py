"""RelationalThreadStore.aclose ends the group commit's committer thread.

The store kit's worker pool (``roder-store-worker``) is the process's, shared by every
store, and outlives any one of them by design: it is not the store's to end.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from roder_api.testing.conformance import make_metadata, user_item
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_the_relational_store_ends_its_committer_on_close(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = await SqliteThreadStoreFactory(tmp_path / "threads.sqlite3").open()
    await store.create_thread(make_metadata("one"))
    await store.append_events("one", [user_item("hi")])
    started = [t for t in threading.enumerate() if t not in before]
    assert any(t.name == "roder-group-commit" for t in started)
    await store.aclose()
    own = [t for t in started if t.name.startswith("roder-") and t.name != "roder-store-worker"]
    for thread in own:
        thread.join(5)
    assert [t.name for t in own if t.is_alive()] == []
