"""SQLite-specific behaviour: WAL, schema versions, settings, and real processes sharing a file.

The whole conformance kit runs against this store in ``tests/test_store_conformance.py``.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import StoreError
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.testing.conformance import make_metadata, user_item
from roder_api.transcript import UserMessage
from roder_sqlite_thread_store import SCHEMA_VERSION, SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio

WRITER = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import ItemCompleted
    from roder_api.transcript import UserMessage
    from roder_sqlite_thread_store import SqliteThreadStoreFactory

    async def main(path, worker, batches, *threads):
        store = await SqliteThreadStoreFactory(path).open()
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


async def test_file_is_wal_with_a_versioned_schema(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "threads.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    await store.create_thread(make_metadata("one"))
    await store.aclose()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"roder_threads", "roder_events"} <= tables
    # Opening again migrates nothing and keeps the data.
    store = await SqliteThreadStoreFactory(path).open()
    assert await store.thread_exists("one")
    await store.aclose()


async def test_a_newer_schema_is_refused_with_advice(tmp_path: Path) -> None:
    path = tmp_path / "threads.sqlite3"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer Roder"):
        await SqliteThreadStoreFactory(path).open()


async def test_an_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="cannot use"):
        await SqliteThreadStoreFactory(tmp_path / "file" / "threads.sqlite3").open()


def test_bad_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown durability"):
        SqliteThreadStoreFactory(tmp_path / "x.sqlite3", durability="sometimes")


async def test_durability_none_turns_off_syncing(tmp_path: Path) -> None:
    store = await SqliteThreadStoreFactory(tmp_path / "x.sqlite3", durability="none").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("fast")])
    assert (await store.get_thread(tid)).last_sequence == 1
    await store.aclose()


def test_the_plugin_registers_with_its_settings(tmp_path: Path) -> None:
    builder = ExtensionRegistryBuilder(
        settings={"sqlite": {"path": str(tmp_path / "db.sqlite3"), "durability": "normal"}}
    )
    [info] = builder.load_entry_points(names=["sqlite"])
    assert info.error is None and info.thread_stores == ("sqlite",)
    factory = builder.build().thread_store_factory("sqlite")
    assert isinstance(factory, SqliteThreadStoreFactory)
    assert factory.path == tmp_path / "db.sqlite3"
    assert factory.durability == "normal"
    assert "sqlite at" in factory.describe()


def _spawn(path: Path, worker: str, batches: int, threads: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), worker, str(batches), *threads],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _acknowledged(lines: str) -> dict[str, list[tuple[int, int]]]:
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in lines.splitlines(keepends=True):
        if not line.endswith("\n"):
            continue  # cut short by the kill (stdout is buffered): not acknowledged
        tid, sequence, size = line.split()
        acked[tid].append((int(sequence), int(size)))
    return acked


@pytest.mark.slow
async def test_several_processes_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    threads = ["shared-a", "shared-b"]
    for tid in threads:
        await store.create_thread(make_metadata(tid))
    procs = [_spawn(path, f"w{n}", 40, threads) for n in range(4)]
    acked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for proc in procs:
        out, err = await anyio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == 0, err
        for tid, items in _acknowledged(out).items():
            acked[tid].extend(items)
    total = 0
    for tid in threads:
        total += check_journal(await store.read_events(tid), acked[tid])
        meta = await store.get_thread(tid)
        assert meta.last_sequence == meta.item_count == len(await store.read_events(tid))
    assert total == 4 * 40
    await store.aclose()


@pytest.mark.slow
async def test_a_killed_writer_leaves_no_partial_batch(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    await store.create_thread(make_metadata("victim"))
    other = _spawn(path, "steady", 30, ["victim"])
    proc = _spawn(path, "killed", 100_000, ["victim"])
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
    # The store goes on after the kill.
    got = await store.append_events("victim", [user_item("after")])
    assert got[0].sequence == (await store.get_thread("victim")).last_sequence
    await store.aclose()


async def test_a_failing_write_in_a_commit_group_fails_alone(tmp_path: Path) -> None:
    from roder_api.errors import ThreadNotFoundError

    store = await SqliteThreadStoreFactory(tmp_path / "group.sqlite3").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    outcomes: list[str] = []

    async def append(target: str, index: int) -> None:
        try:
            await store.append_events(target, [user_item(f"{index}")])
            outcomes.append("ok")
        except ThreadNotFoundError:
            outcomes.append("missing")

    # Writes queued together share a transaction; the ones for a missing thread fail alone.
    async with anyio.create_task_group() as tg:
        for index in range(40):
            tg.start_soon(append, tid if index % 4 else "missing-thread", index)
    assert sorted(outcomes) == ["missing"] * 10 + ["ok"] * 30
    journal = await store.read_events(tid)
    assert [e.sequence for e in journal] == list(range(1, 31))
    assert (await store.get_thread(tid)).item_count == 30
    await store.aclose()


async def test_thread_size_counts_the_stored_bytes(tmp_path: Path) -> None:
    from roder_api.errors import ThreadNotFoundError

    store = await SqliteThreadStoreFactory(tmp_path / "size.sqlite3").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    empty = await store.thread_size_bytes(tid)
    assert empty > 0
    await store.append_events(tid, [user_item("x" * 10_000)])
    assert await store.thread_size_bytes(tid) > empty + 10_000
    with pytest.raises(ThreadNotFoundError):
        await store.thread_size_bytes("missing")
    await store.aclose()


# --- reads that never write, leases, the store's own worker threads -------------------------


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


async def test_a_read_only_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "threads.sqlite3"
    for factory in (
        SqliteThreadStoreFactory(missing, read_only=True),
        SqliteThreadStoreFactory(missing, must_exist=True),
    ):
        with pytest.raises(StoreError, match="no SQLite thread store"):
            await factory.open()
    assert not missing.parent.exists(), "opening for reading created something"


async def test_reading_a_read_only_store_changes_no_file(tmp_path: Path) -> None:
    path = tmp_path / "db" / "threads.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    tid = (await store.create_thread(make_metadata(title="kept"))).thread_id
    await store.append_events(tid, [user_item("a"), user_item("b")])
    await store.aclose()
    before = _snapshot(path.parent)
    reader = await SqliteThreadStoreFactory(path, read_only=True).open()
    assert [e.sequence for e in await reader.read_events(tid)] == [1, 2]
    assert (await reader.list_threads()).threads[0].title == "kept"
    assert (await reader.get_thread(tid)).last_sequence == 2
    with pytest.raises(StoreError, match="read-only"):
        await reader.append_events(tid, [user_item("no")])
    with pytest.raises(StoreError, match="read-only"):
        reader.lease(tid, owner="reader")
    await reader.aclose()
    after = _snapshot(path.parent)
    # SQLite may make its WAL index (-wal, -shm) where it can; the database is untouched.
    assert after[path.name] == before[path.name], "a read-only open changed the database"
    assert set(after) - set(before) <= {path.name + "-wal", path.name + "-shm"}
    assert not (path.parent / (path.name + ".leases")).exists()


async def test_a_read_only_store_reads_a_file_it_cannot_write(tmp_path: Path) -> None:
    # immutable=1 is what SQLite needs on a directory where no WAL index can be made; the
    # store falls back to it when a plain mode=ro open fails.
    path = tmp_path / "threads.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("a")])
    await store.aclose()
    os.chmod(path, 0o444)
    try:
        reader = await SqliteThreadStoreFactory(path, read_only=True).open()
        assert [e.sequence for e in await reader.read_events(tid)] == [1]
        await reader.aclose()
    finally:
        os.chmod(path, 0o644)


async def test_leases_are_files_beside_the_database(tmp_path: Path) -> None:
    from roder_api.errors import ThreadBusyError

    path = tmp_path / "threads.sqlite3"
    first = await SqliteThreadStoreFactory(path).open()
    second = await SqliteThreadStoreFactory(path).open()
    tid = (await first.create_thread(make_metadata())).thread_id
    async with first.lease(tid, owner="one"):
        assert (tmp_path / "threads.sqlite3.leases" / f"{tid}.lease").exists()
        with pytest.raises(ThreadBusyError, match="one"):
            async with second.lease(tid, owner="two"):
                pass
    async with second.lease(tid, owner="two"):
        pass
    await first.aclose()
    await second.aclose()


async def test_the_store_uses_its_own_worker_threads(tmp_path: Path) -> None:
    # anyio's default pool is exhausted by someone else: the store still answers, on its
    # own CapacityLimiter, and never borrows from that pool.
    store = await SqliteThreadStoreFactory(tmp_path / "threads.sqlite3").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    default = anyio.to_thread.current_default_thread_limiter()
    saved = default.total_tokens
    release = anyio.Event()
    try:
        default.total_tokens = 1
        async with anyio.create_task_group() as tg:

            async def hog() -> None:
                async with default:
                    await release.wait()

            tg.start_soon(hog)
            await anyio.sleep(0.05)
            with anyio.fail_after(20):
                async with anyio.create_task_group() as writers:
                    for index in range(20):
                        writers.start_soon(store.append_events, tid, [user_item(f"{index}")])
                assert len(await store.read_events(tid)) == 20
            assert store.limiter.total_tokens == store.max_threads
            release.set()
    finally:
        default.total_tokens = saved
        await store.aclose()
