"""RelationalThreadStore.aclose ends the group commit's committer thread."""

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
    for thread in started:
        if thread.name.startswith("roder-"):
            thread.join(5)
    assert [t.name for t in started if t.is_alive() and t.name.startswith("roder-")] == []
