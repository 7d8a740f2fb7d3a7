"""The rows a SQLite store keeps between its write transactions (``keeps_rows``).

An append takes the thread's row from memory while ``PRAGMA data_version`` says no other
connection has committed; a write of another connection (another store on the file,
another process, a plain ``sqlite3`` connection) makes it read the row again, and a failed
transaction leaves nothing behind in memory.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import anyio
import pytest

from roder_api.errors import SequenceConflictError, ThreadNotFoundError
from roder_api.testing.conformance import make_metadata, user_item
from roder_sqlite_thread_store import SqliteThreadStore, SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio


def traced(store: SqliteThreadStore) -> list[str]:
    """Return the list the writer connection's statements are recorded in (verbs only)."""
    assert store._writer is not None
    statements: list[str] = []
    store._writer.set_trace_callback(lambda sql: statements.append(" ".join(sql.split()[:2])))
    return statements


async def test_an_append_reads_no_row_it_committed_itself(tmp_path: Path) -> None:
    store = await SqliteThreadStoreFactory(tmp_path / "t.sqlite3").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("one")])
    statements = traced(store)
    await store.append_events(tid, [user_item(f"item {i}") for i in range(3)])
    # One multi-row INSERT for the batch, and no SELECT of the thread's row.
    assert statements == [
        "BEGIN IMMEDIATE",
        "PRAGMA data_version",
        "INSERT INTO",
        "UPDATE roder_threads",
        "COMMIT",
    ]
    metadata = await store.get_thread(tid)
    assert (metadata.last_sequence, metadata.item_count) == (4, 4)
    await store.aclose()


async def test_a_batch_larger_than_one_insert_is_whole(tmp_path: Path) -> None:
    store = await SqliteThreadStoreFactory(tmp_path / "t.sqlite3").open()
    tid = (await store.create_thread(make_metadata())).thread_id
    statements = traced(store)
    got = await store.append_events(tid, [user_item(f"item {i}") for i in range(150)])
    assert [entry.sequence for entry in got] == list(range(1, 151))
    assert statements.count("INSERT INTO") == 3  # 64 + 64 + 22 rows
    read = await store.read_events(tid)
    assert [entry.event for entry in read] == [entry.event for entry in got]
    await store.aclose()


async def test_another_stores_writes_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    first = await SqliteThreadStoreFactory(path).open()
    second = await SqliteThreadStoreFactory(path).open()
    tid = (await first.create_thread(make_metadata())).thread_id
    await first.append_events(tid, [user_item("a")])
    await second.append_events(tid, [user_item("b")])
    await second.update_thread(tid, title="set by the other store")
    # The row the first store kept is stale: its next append must read the new one.
    with pytest.raises(SequenceConflictError):
        await first.append_events(tid, [user_item("late")], expected_last_sequence=1)
    got = await first.append_events(tid, [user_item("c")], expected_last_sequence=2)
    assert got[0].sequence == 3
    metadata = await first.get_thread(tid)
    assert metadata.title == "set by the other store"
    assert (metadata.last_sequence, metadata.item_count) == (3, 3)
    await first.aclose()
    await second.aclose()


async def test_a_plain_connections_write_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("a")])
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM roder_events WHERE thread_id = ?", (tid,))
        conn.execute("DELETE FROM roder_threads WHERE thread_id = ?", (tid,))
    # The row the store kept says the thread exists; the database says otherwise.
    with pytest.raises(ThreadNotFoundError):
        await store.append_events(tid, [user_item("orphan")])
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM roder_events").fetchone()[0] == 0
    await store.aclose()


async def test_another_process_appending_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("a")])
    script = textwrap.dedent(
        """
        import sys, anyio
        from roder_api.testing.conformance import user_item
        from roder_sqlite_thread_store import SqliteThreadStoreFactory

        async def main(path, tid):
            store = await SqliteThreadStoreFactory(path).open()
            await store.append_events(tid, [user_item("x"), user_item("y")])
            await store.aclose()

        anyio.run(main, *sys.argv[1:])
        """
    )
    with anyio.fail_after(60):
        await anyio.run_process([sys.executable, "-c", script, str(path), tid])
    got = await store.append_events(tid, [user_item("b")])
    assert got[0].sequence == 4
    assert (await store.get_thread(tid)).item_count == 4
    await store.aclose()


class FailingCommit(SqliteThreadStore):
    """Fails (once ``fail`` is set) after a transaction's statements, where its commit
    would be: the transaction rolls back."""

    fail = False

    @contextmanager
    def write_transaction(self) -> Iterator[sqlite3.Connection]:
        with super().write_transaction() as conn:
            yield conn
            if self.fail:
                raise sqlite3.OperationalError("disk I/O error (injected)")


async def test_a_failed_transaction_leaves_no_row_behind(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    await (await SqliteThreadStoreFactory(path).open()).aclose()  # the schema
    store = FailingCommit(path)
    store.warm()
    tid = (await store.create_thread(make_metadata())).thread_id
    await store.append_events(tid, [user_item("a")])
    store.fail = True
    with pytest.raises(Exception, match="injected"):
        await store.append_events(tid, [user_item("lost"), user_item("lost too")])
    store.fail = False
    got = await store.append_events(tid, [user_item("b")])
    assert got[0].sequence == 2
    metadata = await store.get_thread(tid)
    assert (metadata.last_sequence, metadata.item_count) == (2, 2)
    assert [entry.sequence for entry in await store.read_events(tid)] == [1, 2]
    await store.aclose()
