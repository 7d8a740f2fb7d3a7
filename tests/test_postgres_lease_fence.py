"""PostgreSQL: a holder whose lease connection died stops writing (its appends are fenced
by the lease, in the same transaction) and its user sees why; a second session takes the
thread over and closes the dead turn by the crash rules, and nothing of the first lands
after that. The lease's backend is ended for real with ``pg_terminate_backend``."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import psycopg
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import LeaseLostError, RecorderError
from roder_api.events import AbortReason, AssistantContentDelta, TurnAborted, TurnComplete
from roder_api.testing import ScriptedEngine
from roder_postgres_thread_store import PostgresThreadStoreFactory
from roder_runtime import Runtime, UserInput

from .postgres_support import require_postgres, temporary_schema
from .session_support import events_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg() -> Iterator[tuple[str, str]]:
    dsn = require_postgres()
    with temporary_schema("roder_fence") as schema:
        yield dsn, schema


def runtime_on(dsn: str, schema: str, engine: ScriptedEngine, name: str) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(PostgresThreadStoreFactory(dsn, schema=schema))
    return Runtime(builder.build(), name=name)


def terminate_lease_backend(dsn: str, schema: str, thread_id: str) -> int:
    """End the backend that holds the thread's advisory lock; return its pid."""
    key = f"roder-lease:{schema}:{thread_id}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT l.pid FROM pg_locks l, (SELECT hashtextextended(%s, 0) AS k) h"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            " AND l.classid = ((h.k >> 32) & 4294967295)::oid"
            " AND l.objid = (h.k & 4294967295)::oid",
            (key,),
        ).fetchone()
        assert row is not None, "nobody holds the lease"
        conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        return int(row[0])


async def test_a_holder_that_lost_its_lease_stops_writing_and_says_so(
    pg: tuple[str, str],
) -> None:
    dsn, schema = pg
    slow = ScriptedEngine(delta_delay=0.05)
    text = "tell me a long story " + " ".join(f"w{i}" for i in range(80))
    async with runtime_on(dsn, schema, slow, "first") as first:
        thread_id = (await first.create_thread()).thread_id
        async with first.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput(text))
            with anyio.fail_after(20):
                while not isinstance((await session.next_event()).event, AssistantContentDelta):
                    pass
            terminate_lease_backend(dsn, schema, thread_id)
            # The first session's user is told: its appends are refused from now on.
            with pytest.raises(RecorderError) as stopped, anyio.fail_after(20):
                while True:
                    await session.next_event()
            assert isinstance(stopped.value.__cause__, LeaseLostError)
            assert "lease" in str(stopped.value) and thread_id in str(stopped.value)
            # A second session takes the thread over while the first is still open.
            async with runtime_on(dsn, schema, ScriptedEngine(), "second") as second:
                async with second.start_session(thread_id) as taker:
                    closed = await events_until(taker)
                    assert closed[-1].event == TurnAborted(turn_id, AbortReason.PROCESS_EXITED)
                    mine = await taker.submit(UserInput("after the takeover"))
                    done = await events_until(taker)
                    assert done[-1].event == TurnComplete(mine, "You said: after the takeover")
                await anyio.sleep(0.5)  # the first one's stream would still be running
                events = (await second.event_page(thread_id, limit=10_000)).events
    kinds = [e.event for e in events]
    end = kinds.index(TurnAborted(turn_id, AbortReason.PROCESS_EXITED))
    assert not [e for e in kinds[end:] if getattr(e, "turn_id", None) == turn_id][1:]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))


async def test_a_lost_lease_is_found_before_anyone_takes_over(pg: tuple[str, str]) -> None:
    """The connection died and nobody else came: the holder still stops writing."""
    dsn, schema = pg
    async with runtime_on(dsn, schema, ScriptedEngine(delta_delay=0.05), "first") as first:
        thread_id = (await first.create_thread()).thread_id
        async with first.start_session(thread_id) as session:
            await session.submit(UserInput("a b c d e f g h i j k l m n o p q r s t"))
            with anyio.fail_after(20):
                while not isinstance((await session.next_event()).event, AssistantContentDelta):
                    pass
            terminate_lease_backend(dsn, schema, thread_id)
            before = (await first.get_thread(thread_id)).last_sequence
            with pytest.raises(RecorderError), anyio.fail_after(20):
                while True:
                    await session.next_event()
        after = (await first.get_thread(thread_id)).last_sequence
        assert after - before <= 1  # at most the batch in flight when the backend ended
