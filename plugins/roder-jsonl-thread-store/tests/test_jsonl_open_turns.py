"""Open turns in the JSONL store: the index column the pending-input query reads, folded
by the writer and by a scan alike, and an index of version 1 (no column) rebuilt once when
a store that writes opens it — or left untouched, the answer built in memory, read-only."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    InputAccepted,
    TurnComplete,
    TurnStarted,
)
from roder_api.testing.conformance import make_metadata, user_item
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._index import INDEX_VERSION

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def _threads(factory: JsonlThreadStoreFactory) -> dict[str, str]:
    """Store a thread with a long open turn and one whose turn ended; return their ids."""
    store = await factory.open()
    try:
        pending = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(pending, [InputAccepted("r1", "go"), TurnStarted("r1")])
        for start in range(0, 150, 30):
            await store.append_events(
                pending,
                [
                    AssistantContentDelta("r1", "s", ContentPhase.FINAL_ANSWER, f"w{i}")
                    for i in range(start, start + 30)
                ],
            )
        ended = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(
            ended, [TurnStarted("a"), user_item("hi", "a"), TurnComplete("a")]
        )
    finally:
        await store.aclose()
    return {"pending": pending, "ended": ended}


def _index(base: Path) -> tuple[str, dict[str, int] | None]:
    """Return the index's version and its open_turns values (None: no such column)."""
    with closing(sqlite3.connect(base / "index.sqlite3")) as db:
        version = db.execute("SELECT value FROM info WHERE key = 'version'").fetchone()[0]
        columns = [row[1] for row in db.execute("PRAGMA table_info(threads)")]
        values = None
        if "open_turns" in columns:
            values = dict(db.execute("SELECT thread_id, open_turns FROM threads"))
    return str(version), values


def _as_version_1(base: Path) -> None:
    """Turn the index back into what version 1 wrote: no column, no metadata field."""
    with closing(sqlite3.connect(base / "index.sqlite3", isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        db.execute("DROP INDEX threads_open")
        db.execute("ALTER TABLE threads DROP COLUMN open_turns")
        for thread_id, raw in db.execute("SELECT thread_id, meta FROM threads").fetchall():
            data = orjson.loads(raw)
            data.pop("open_turns")
            db.execute(
                "UPDATE threads SET meta = ? WHERE thread_id = ?", (orjson.dumps(data), thread_id)
            )
        db.execute("UPDATE info SET value = '1' WHERE key = 'version'")
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _files(base: Path) -> dict[str, bytes]:
    return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}


async def test_the_index_column_follows_writes_and_scans(
    factory: JsonlThreadStoreFactory, tmp_path: Path
) -> None:
    threads = await _threads(factory)
    base = tmp_path / "store"
    assert _index(base) == (str(INDEX_VERSION), {threads["pending"]: 1, threads["ended"]: 0})
    store = await factory.open()
    try:
        assert await store.threads_with_pending_input() == [threads["pending"]]
        # Another store appended behind this one's index row: a scan folds what it gained.
        other = await factory.open()
        try:
            await other.append_events(threads["pending"], [TurnComplete("r1")])
        finally:
            await other.aclose()
        assert (await store.get_thread(threads["pending"])).open_turns == ()
        assert await store.threads_with_pending_input() == []
    finally:
        await store.aclose()
    # A rebuild from the journals alone (the scan's fold) agrees with the writer's.
    (base / "index.sqlite3").unlink()
    for suffix in ("-wal", "-shm"):
        (base / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    store = await factory.open()
    try:
        assert await store.threads_with_pending_input() == []
        await store.append_events(threads["ended"], [InputAccepted("b", "more")])
        assert await store.threads_with_pending_input() == [threads["ended"]]
    finally:
        await store.aclose()


async def test_a_version_1_index_is_read_as_it_is_when_read_only(
    factory: JsonlThreadStoreFactory, tmp_path: Path
) -> None:
    threads = await _threads(factory)
    base = tmp_path / "store"
    _as_version_1(base)
    before = _files(base)
    reader = await JsonlThreadStoreFactory(base, read_only=True).open()
    try:
        # Built in memory from the journals: the same answer, nothing written.
        assert await reader.threads_with_pending_input() == [threads["pending"]]
        assert (await reader.get_thread(threads["pending"])).open_turns == ("r1",)
    finally:
        await reader.aclose()
    assert _files(base) == before, "a read-only open changed a file"


async def test_a_version_1_index_is_rebuilt_once_when_opened(
    factory: JsonlThreadStoreFactory, tmp_path: Path
) -> None:
    threads = await _threads(factory)
    base = tmp_path / "store"
    _as_version_1(base)
    store = await factory.open()
    try:
        assert await store.threads_with_pending_input() == [threads["pending"]]
        assert _index(base) == (str(INDEX_VERSION), {threads["pending"]: 1, threads["ended"]: 0})
        assert (await store.get_thread(threads["pending"])).open_turns == ("r1",)
    finally:
        await store.aclose()
