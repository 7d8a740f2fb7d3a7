"""Open turns in the PostgreSQL store: the indexed column the pending-input query reads,
and a store of schema version 2 (no column) migrated once when opened — also with
``must_exist`` — or read as it is, unchanged, when opened read-only."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    InputAccepted,
    TurnComplete,
    TurnStarted,
)
from roder_api.testing.conformance import make_metadata, user_item
from roder_postgres_thread_store import SCHEMA_VERSION, PostgresThreadStoreFactory

pytestmark = pytest.mark.anyio


async def _threads(dsn: str, schema: str) -> dict[str, str]:
    """Store a thread with a long open turn and one whose turn ended; return their ids."""
    store = await PostgresThreadStoreFactory(dsn, schema=schema, max_size=2).open()
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


def _connect(dsn: str, schema: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")


def _state(dsn: str, schema: str) -> tuple[int, dict[str, int] | None, list[Any]]:
    """Return the schema version, the open_turns values (None: no column), the metadata."""
    with _connect(dsn, schema) as conn:
        row = conn.execute("SELECT max(version) FROM roder_schema_version").fetchone()
        column = conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'roder_threads' AND column_name = 'open_turns'",
            (schema,),
        ).fetchone()
        values = None
        if column is not None:
            values = dict(conn.execute("SELECT thread_id, open_turns FROM roder_threads"))
        metadata = [r[0] for r in conn.execute("SELECT metadata FROM roder_threads ORDER BY 1")]
    assert row is not None
    return int(row[0]), values, metadata


def _as_version_2(dsn: str, schema: str) -> None:
    """Turn the store back into what schema version 2 wrote: no column, no field."""
    with _connect(dsn, schema) as conn, conn.transaction():
        conn.execute("DROP INDEX roder_threads_open")
        conn.execute("ALTER TABLE roder_threads DROP COLUMN open_turns")
        for thread_id, raw in conn.execute("SELECT thread_id, metadata FROM roder_threads"):
            data = orjson.loads(raw)
            data.pop("open_turns")
            conn.execute(
                "UPDATE roder_threads SET metadata = %s WHERE thread_id = %s",
                (orjson.dumps(data).decode(), thread_id),
            )
        conn.execute("DELETE FROM roder_schema_version WHERE version = 3")


async def test_the_column_follows_every_append(postgres_dsn: str, schema: str) -> None:
    threads = await _threads(postgres_dsn, schema)
    assert _state(postgres_dsn, schema)[1] == {threads["pending"]: 1, threads["ended"]: 0}
    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema, max_size=2).open()
    try:
        assert await store.threads_with_pending_input() == [threads["pending"]]
        await store.append_events(threads["pending"], [TurnComplete("r1")])
        assert await store.threads_with_pending_input() == []
    finally:
        await store.aclose()
    with _connect(postgres_dsn, schema) as conn:
        # A two-row table: with statistics and no scan of the whole table allowed, the
        # planner shows the partial index serves the query.
        conn.execute("ANALYZE roder_threads")
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            str(row[0])
            for row in conn.execute(
                sql.SQL(
                    "EXPLAIN SELECT thread_id FROM roder_threads WHERE open_turns > 0 AND "
                    "updated_at_ms >= 0 ORDER BY updated_at_ms DESC, thread_id DESC LIMIT 100"
                )
            )
        )
    assert "roder_threads_open" in plan, plan


async def test_a_version_2_store_is_read_as_it_is_when_read_only(
    postgres_dsn: str, schema: str
) -> None:
    threads = await _threads(postgres_dsn, schema)
    _as_version_2(postgres_dsn, schema)
    before = _state(postgres_dsn, schema)
    factory = PostgresThreadStoreFactory(postgres_dsn, schema=schema, read_only=True)
    reader = await factory.open()
    try:
        assert not reader.open_turns_column
        # No column to query: it pages through the journals, and finds the long turn.
        assert await reader.threads_with_pending_input() == [threads["pending"]]
    finally:
        await reader.aclose()
    assert _state(postgres_dsn, schema) == before, "a read-only open changed the store"
    assert before[0] == 2 and before[1] is None


@pytest.mark.parametrize("must_exist", [False, True])
async def test_a_version_2_store_is_migrated_once_when_opened(
    postgres_dsn: str, schema: str, must_exist: bool
) -> None:
    threads = await _threads(postgres_dsn, schema)
    _as_version_2(postgres_dsn, schema)
    factory = PostgresThreadStoreFactory(
        postgres_dsn, schema=schema, max_size=2, must_exist=must_exist
    )
    store = await factory.open()
    try:
        version, values, _ = _state(postgres_dsn, schema)
        assert version == SCHEMA_VERSION
        assert values == {threads["pending"]: 1, threads["ended"]: 0}
        assert (await store.get_thread(threads["pending"])).open_turns == ("r1",)
        assert await store.threads_with_pending_input() == [threads["pending"]]
        await store.append_events(threads["ended"], [InputAccepted("b", "more")])
        assert await store.threads_with_pending_input() == [threads["ended"], threads["pending"]]
    finally:
        await store.aclose()
