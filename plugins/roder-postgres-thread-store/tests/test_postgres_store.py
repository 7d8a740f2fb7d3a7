"""PostgreSQL-specific behaviour: schema migration, DSN settings, and real processes sharing
threads (the scale-out path).

The whole conformance kit runs against this store in ``tests/test_store_conformance.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict

import anyio
import psycopg
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import StoreError
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.testing.conformance import make_metadata, user_item
from roder_api.transcript import UserMessage
from roder_postgres_thread_store import (
    DSN_ENV,
    SCHEMA_VERSION,
    PostgresThreadStoreFactory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

WRITER = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import ItemCompleted
    from roder_api.testing.conformance import make_metadata
    from roder_api.errors import ThreadExistsError
    from roder_api.transcript import UserMessage
    from roder_postgres_thread_store import PostgresThreadStoreFactory

    async def main(dsn, schema, worker, batches, *threads):
        store = await PostgresThreadStoreFactory(dsn, schema=schema, max_size=2).open()
        for tid in threads:
            try:
                await store.create_thread(make_metadata(tid))
            except ThreadExistsError:
                pass
        for batch in range(int(batches)):
            tid = threads[batch % len(threads)]
            size = 1 + batch % 3
            events = [
                ItemCompleted("t", UserMessage(f"{worker}:{batch}:{i}:{size}"))
                for i in range(size)
            ]
            got = await store.append_events(tid, events)
            if batch % 4 == 0:
                assert len(await store.read_events(tid, after=got[0].sequence - 1)) >= size
                await store.list_threads(limit=5)
            print(tid, got[0].sequence, size, flush=True)
        await store.aclose()

    anyio.run(main, *sys.argv[1:])
    """
)


def check_journal(entries: list[JournalEvent], acknowledged: list[tuple[int, int]]) -> int:
    """Assert that a journal written by WRITER processes is whole; return its batch count."""
    assert [e.sequence for e in entries] == list(range(1, len(entries) + 1))
    batches: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
    for entry in entries:
        assert isinstance(entry.event, ItemCompleted)
        assert isinstance(entry.event.item, UserMessage)
        worker, batch, index, size = entry.event.item.text.split(":")
        batches[worker, batch].append((entry.sequence, int(index), int(size)))
    for parts in batches.values():
        size = parts[0][2]
        assert [index for _, index, _ in parts] == list(range(size)), "a partial batch"
        assert [seq for seq, _, _ in parts] == list(range(parts[0][0], parts[0][0] + size))
    by_sequence = {e.sequence: e for e in entries}
    for sequence, size in acknowledged:
        assert sequence in by_sequence and sequence + size - 1 in by_sequence
    return len(batches)


def _spawn(
    dsn: str, schema: str, worker: str, batches: int, threads: list[str]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, dsn, schema, worker, str(batches), *threads],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _acknowledged(lines: str) -> dict[str, list[tuple[int, int]]]:
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in lines.splitlines():
        tid, sequence, size = line.split()
        acked[tid].append((int(sequence), int(size)))
    return acked


async def test_schema_is_created_and_versioned(postgres_dsn: str, schema: str) -> None:
    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    await store.create_thread(make_metadata("one"))
    await store.aclose()
    with psycopg.connect(postgres_dsn) as conn:
        versions = conn.execute(
            f"SELECT version FROM {schema}.roder_schema_version ORDER BY version"
        ).fetchall()
        assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))
        assert conn.execute(f"SELECT count(*) FROM {schema}.roder_threads").fetchone() == (1,)
    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    assert await store.thread_exists("one")
    await store.aclose()


async def test_a_newer_schema_is_refused_with_advice(postgres_dsn: str, schema: str) -> None:
    await (await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()).aclose()
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(
            f"INSERT INTO {schema}.roder_schema_version (version) VALUES (%s)",
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(StoreError, match="newer Roder"):
        await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()


async def test_dsn_from_the_environment(
    postgres_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, postgres_dsn)
    store = await PostgresThreadStoreFactory(schema=schema).open()
    await store.create_thread(make_metadata("from-env"))
    await store.aclose()
    monkeypatch.delenv(DSN_ENV)
    with pytest.raises(StoreError, match=DSN_ENV):
        await PostgresThreadStoreFactory(schema=schema).open()


async def test_an_unreachable_server_is_a_clear_store_error() -> None:
    # Port 1 on the loopback interface: nothing listens there.
    factory = PostgresThreadStoreFactory(
        "postgresql://nobody:secret@127.0.0.1:1/none", connect_timeout_s=2
    )
    with pytest.raises(StoreError, match="server is running") as info:
        await factory.open()
    assert "secret" not in str(info.value)
    assert "secret" not in factory.describe()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="schema"):
        PostgresThreadStoreFactory("postgresql://x", schema="Robert'); DROP TABLE x;--")
    with pytest.raises(ValueError, match="pool sizes"):
        PostgresThreadStoreFactory("postgresql://x", min_size=3, max_size=2)


def test_the_plugin_registers_with_its_settings() -> None:
    builder = ExtensionRegistryBuilder(
        settings={"postgres": {"dsn": "postgresql://u@db.invalid/x", "schema": "agents"}}
    )
    [info] = builder.load_entry_points(names=["postgres"])
    assert info.error is None and info.thread_stores == ("postgres",)
    factory = builder.build().thread_store_factory("postgres")
    assert isinstance(factory, PostgresThreadStoreFactory)
    assert factory.dsn == "postgresql://u@db.invalid/x" and factory.schema == "agents"


@pytest.mark.slow
def test_processes_starting_together_migrate_once(postgres_dsn: str, schema: str) -> None:
    procs = [_spawn(postgres_dsn, schema, f"w{n}", 3, ["start-a"]) for n in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(f"SELECT version FROM {schema}.roder_schema_version").fetchall()
        assert [v for (v,) in rows] == list(range(1, SCHEMA_VERSION + 1))
        count = conn.execute(f"SELECT count(*) FROM {schema}.roder_events").fetchone()
        assert count == (4 * (1 + 2 + 3),)


@pytest.mark.slow
async def test_several_processes_write_and_read_the_same_threads(
    postgres_dsn: str, schema: str
) -> None:
    threads = ["shared-a", "shared-b", "shared-c"]
    procs = [_spawn(postgres_dsn, schema, f"w{n}", 45, threads) for n in range(4)]
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for proc in procs:
        out, err = await anyio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == 0, err
        for tid, items in _acknowledged(out).items():
            acked[tid].extend(items)
    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    total = 0
    for tid in threads:
        journal = await store.read_events(tid)
        total += check_journal(journal, acked[tid])
        meta = await store.get_thread(tid)
        assert meta.last_sequence == meta.item_count == len(journal)
    assert total == 4 * 45
    await store.aclose()


@pytest.mark.slow
async def test_a_killed_writer_leaves_no_partial_batch(postgres_dsn: str, schema: str) -> None:
    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    await store.create_thread(make_metadata("victim"))
    other = _spawn(postgres_dsn, schema, "steady", 30, ["victim"])
    proc = _spawn(postgres_dsn, schema, "killed", 100_000, ["victim"])
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    while len(lines) < 20 and time.monotonic() < deadline:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        if not line:
            break
        lines.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = await anyio.to_thread.run_sync(proc.communicate)
    lines.append(rest)
    out, err = await anyio.to_thread.run_sync(other.communicate)
    assert other.returncode == 0, err
    acked = _acknowledged("".join(lines))["victim"] + _acknowledged(out)["victim"]
    assert len(acked) >= 50
    check_journal(await store.read_events("victim"), acked)
    got = await store.append_events("victim", [user_item("after")])
    assert got[0].sequence == (await store.get_thread("victim")).last_sequence
    await store.aclose()


async def test_thread_size_counts_the_stored_bytes(postgres_dsn: str, schema: str) -> None:
    from roder_api.errors import ThreadNotFoundError

    store = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    tid = (await store.create_thread(make_metadata())).thread_id
    empty = await store.thread_size_bytes(tid)
    assert empty > 0
    await store.append_events(tid, [user_item("ü" * 10_000)])
    assert await store.thread_size_bytes(tid) > empty + 20_000
    with pytest.raises(ThreadNotFoundError):
        await store.thread_size_bytes("missing")
    await store.aclose()


async def test_a_read_only_open_of_a_missing_schema_creates_nothing(
    postgres_dsn: str, schema: str
) -> None:
    for factory in (
        PostgresThreadStoreFactory(postgres_dsn, schema=schema, read_only=True),
        PostgresThreadStoreFactory(postgres_dsn, schema=schema, must_exist=True),
    ):
        with pytest.raises(StoreError, match="no Roder thread store"):
            await factory.open()
    with psycopg.connect(postgres_dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        assert found.fetchone() is None, "a read-only open created the schema"


async def test_a_lease_names_its_holder_from_the_leases_table(
    postgres_dsn: str, schema: str
) -> None:
    from roder_api.errors import ThreadBusyError

    first = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    second = await PostgresThreadStoreFactory(postgres_dsn, schema=schema).open()
    try:
        tid = (await first.create_thread(make_metadata())).thread_id
        async with first.lease(tid, owner="worker-a") as lease:
            with psycopg.connect(postgres_dsn) as conn:
                row = conn.execute(
                    f"SELECT owner, pid FROM {schema}.roder_leases WHERE thread_id = %s", (tid,)
                ).fetchone()
            assert row == ("worker-a", lease.holder.pid)
            with pytest.raises(ThreadBusyError, match="worker-a") as info:
                async with second.lease(tid, owner="worker-b"):
                    pass
            assert info.value.holder == lease.holder
        with psycopg.connect(postgres_dsn) as conn:
            gone = conn.execute(
                f"SELECT count(*) FROM {schema}.roder_leases WHERE thread_id = %s", (tid,)
            ).fetchone()
        assert gone == (0,), "a released lease left its holder behind"
        async with second.lease(tid, owner="worker-b"):
            pass
    finally:
        await first.aclose()
        await second.aclose()
