"""Open turns in the SQLite store: the indexed column the pending-input query reads, and a
store of schema version 1 (no column) migrated once when opened — or read as it is,
unchanged, when opened read-only."""

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
from roder_sqlite_thread_store import SCHEMA_VERSION, SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio


async def _threads(path: Path) -> dict[str, str]:
    """Store a thread with a long open turn and one whose turn ended; return their ids."""
    store = await SqliteThreadStoreFactory(path).open()
    try:
        pending = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(pending, [InputAccepted("r1", "go"), TurnStarted("r1")])
        deltas = [
            AssistantContentDelta("r1", "s", ContentPhase.FINAL_ANSWER, f"w{i}") for i in range(150)
        ]
        await store.append_events(pending, list(deltas))
        ended = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(
            ended, [TurnStarted("a"), user_item("hi", "a"), TurnComplete("a")]
        )
    finally:
        await store.aclose()
    return {"pending": pending, "ended": ended}


def _columns(path: Path) -> tuple[int, list[str], dict[str, int]]:
    """Return the schema version, the columns of roder_threads and the open_turns values."""
    with closing(sqlite3.connect(path)) as conn:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        columns = [row[1] for row in conn.execute("PRAGMA table_info(roder_threads)")]
        values = {}
        if "open_turns" in columns:
            values = dict(conn.execute("SELECT thread_id, open_turns FROM roder_threads"))
    return version, columns, values


def _as_version_1(path: Path) -> None:
    """Turn the store back into what schema version 1 wrote: no column, no field."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP INDEX roder_threads_open")
        conn.execute("ALTER TABLE roder_threads DROP COLUMN open_turns")
        for thread_id, raw in conn.execute("SELECT thread_id, metadata FROM roder_threads"):
            data = orjson.loads(raw)
            data.pop("open_turns")
            conn.execute(
                "UPDATE roder_threads SET metadata = ? WHERE thread_id = ?",
                (orjson.dumps(data), thread_id),
            )
        conn.execute("PRAGMA user_version = 1")
        conn.execute("COMMIT")


async def test_the_column_follows_every_append(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    threads = await _threads(path)
    assert _columns(path)[2] == {threads["pending"]: 1, threads["ended"]: 0}
    store = await SqliteThreadStoreFactory(path).open()
    try:
        assert await store.threads_with_pending_input() == [threads["pending"]]
        with closing(sqlite3.connect(path)) as conn:
            plan = " ".join(
                str(row[-1])
                for row in conn.execute(
                    "EXPLAIN QUERY PLAN SELECT thread_id FROM roder_threads WHERE "
                    "open_turns > 0 AND updated_at_ms >= 0 "
                    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT 100"
                )
            )
        assert "roder_threads_open" in plan, plan
        await store.append_events(threads["pending"], [TurnComplete("r1")])
        assert await store.threads_with_pending_input() == []
    finally:
        await store.aclose()
    assert _columns(path)[2][threads["pending"]] == 0


async def test_a_version_1_store_is_read_as_it_is_when_read_only(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    threads = await _threads(path)
    _as_version_1(path)
    before = path.read_bytes()
    reader = await SqliteThreadStoreFactory(path, read_only=True).open()
    try:
        assert not reader.open_turns_column
        # No column to query: it pages through the journals, and finds the long turn.
        assert await reader.threads_with_pending_input() == [threads["pending"]]
        assert (await reader.get_thread(threads["pending"])).open_turns == ()  # not folded
    finally:
        await reader.aclose()
    assert path.read_bytes() == before, "a read-only open changed the file"
    assert _columns(path)[0] == 1


async def test_a_version_1_store_is_migrated_once_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    threads = await _threads(path)
    _as_version_1(path)
    store = await SqliteThreadStoreFactory(path).open()
    try:
        version, columns, values = _columns(path)
        assert version == SCHEMA_VERSION and "open_turns" in columns
        assert values == {threads["pending"]: 1, threads["ended"]: 0}
        assert (await store.get_thread(threads["pending"])).open_turns == ("r1",)
        assert (await store.get_thread(threads["ended"])).open_turns == ()
        assert await store.threads_with_pending_input() == [threads["pending"]]
        await store.append_events(threads["ended"], [InputAccepted("b", "more")])
        assert await store.threads_with_pending_input() == [threads["ended"], threads["pending"]]
    finally:
        await store.aclose()
