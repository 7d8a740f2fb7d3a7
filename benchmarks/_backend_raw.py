"""The raw driver baselines of ``backends_bench``: a store's work done with the driver alone."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import orjson

from roder_api.codec import to_dict
from roder_api.events import Event, ItemCompleted
from roder_api.testing.conformance import make_metadata
from roder_api.transcript import AssistantMessage

LOCAL_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def item(index: int) -> Event:
    """Return an event whose JSON is about 400 bytes."""
    return ItemCompleted("turn-1", AssistantMessage(f"{index:08d} " + "lorem ipsum " * 28))


def payload(index: int) -> bytes:
    return orjson.dumps(to_dict(item(index)))


# --- raw baselines ----------------------------------------------------------------------------


class Raw:
    """The raw medium under a store: the same work without the store's code."""

    def append_each(self, count: int) -> None:
        """Durably append ``count`` items one at a time."""
        raise NotImplementedError

    def prepare_load(self, count: int) -> None:
        """Write ``count`` items for :meth:`load` and :meth:`tail`."""
        raise NotImplementedError

    def load(self) -> int:
        """Read and decode every item written by :meth:`prepare_load`."""
        raise NotImplementedError

    def tail(self, count: int) -> int:
        """Read and decode the last ``count`` items."""
        raise NotImplementedError

    def prepare_listing(self, count: int) -> None:
        """Create ``count`` thread entries."""
        raise NotImplementedError

    def first_page(self) -> int:
        """Return the first 50 thread entries, newest first."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources."""


class RawFile(Raw):
    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)

    def append_each(self, count: int) -> None:
        fd = os.open(self.base / "append.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for index in range(count):
                os.write(fd, payload(index) + b"\n")
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def prepare_load(self, count: int) -> None:
        with open(self.base / "load.jsonl", "wb") as file:
            file.writelines(payload(i) + b"\n" for i in range(count))

    def load(self) -> int:
        with open(self.base / "load.jsonl", "rb") as file:
            return len([orjson.loads(line) for line in file])

    def tail(self, count: int) -> int:
        with open(self.base / "load.jsonl", "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - 600 * (count + 1)))
            lines = file.read().splitlines()[-count:]
        return len([orjson.loads(line) for line in lines])

    def prepare_listing(self, count: int) -> None:
        listing = self.base / "listing"
        listing.mkdir(exist_ok=True)
        for index in range(count):
            (listing / f"t{index}.jsonl").write_bytes(b"{}\n")

    def first_page(self) -> int:
        entries = [(e.stat().st_mtime_ns, e.name) for e in os.scandir(self.base / "listing")]
        return len(sorted(entries, reverse=True)[:50])


class RawSqlite(Raw):
    def __init__(self, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(base / "raw.sqlite3", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("CREATE TABLE items (seq INTEGER PRIMARY KEY, body BLOB)")
        self.conn.execute("CREATE TABLE load (seq INTEGER PRIMARY KEY, body BLOB)")
        self.conn.execute("CREATE TABLE threads (id TEXT PRIMARY KEY, updated INTEGER, m BLOB)")
        self.conn.execute("CREATE INDEX threads_updated ON threads (updated, id)")

    def append_each(self, count: int) -> None:
        for index in range(count):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT INTO items (body) VALUES (?)", (payload(index),))
            self.conn.execute("COMMIT")

    def prepare_load(self, count: int) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany(
            "INSERT INTO load (seq, body) VALUES (?, ?)", ((i, payload(i)) for i in range(count))
        )
        self.conn.execute("COMMIT")

    def load(self) -> int:
        rows = self.conn.execute("SELECT body FROM load ORDER BY seq").fetchall()
        return len([orjson.loads(body) for (body,) in rows])

    def tail(self, count: int) -> int:
        rows = self.conn.execute(
            "SELECT body FROM load ORDER BY seq DESC LIMIT ?", (count,)
        ).fetchall()
        return len([orjson.loads(body) for (body,) in rows])

    def prepare_listing(self, count: int) -> None:
        meta = orjson.dumps(to_dict(make_metadata("x")))
        self.conn.execute("BEGIN")
        self.conn.executemany(
            "INSERT INTO threads VALUES (?, ?, ?)", ((f"t{i}", i, meta) for i in range(count))
        )
        self.conn.execute("COMMIT")

    def first_page(self) -> int:
        rows = self.conn.execute(
            "SELECT m FROM threads ORDER BY updated DESC, id DESC LIMIT 50"
        ).fetchall()
        return len([orjson.loads(m) for (m,) in rows])

    def close(self) -> None:
        self.conn.close()


class RawPostgres(Raw):
    def __init__(self, dsn: str, schema: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        self.conn.execute("CREATE TABLE raw_items (seq bigserial PRIMARY KEY, body text)")
        self.conn.execute("CREATE TABLE raw_load (seq bigint PRIMARY KEY, body text)")
        self.conn.execute(
            'CREATE TABLE raw_threads (id text COLLATE "C" PRIMARY KEY, updated bigint, m text)'
        )
        self.conn.execute("CREATE INDEX raw_threads_updated ON raw_threads (updated, id)")

    def append_each(self, count: int) -> None:
        for index in range(count):
            self.conn.execute(
                "INSERT INTO raw_items (body) VALUES (%s)", (payload(index).decode(),)
            )

    def prepare_load(self, count: int) -> None:
        with self.conn.cursor() as cursor, cursor.copy("COPY raw_load (seq, body) FROM STDIN") as c:
            for index in range(count):
                c.write_row((index, payload(index).decode()))
        # Fresh planner statistics for both sides, as autovacuum gives a running server
        # within a minute: without them PostgreSQL reads a thread just written with a bitmap
        # scan and an on-disk sort (measured: 77 ms instead of 2 ms for 4,096 events).
        self.conn.execute("ANALYZE raw_load")
        self.conn.execute("ANALYZE roder_events")
        self.conn.execute("ANALYZE roder_threads")

    def load(self) -> int:
        rows = self.conn.execute("SELECT body FROM raw_load ORDER BY seq").fetchall()
        return len([orjson.loads(body) for (body,) in rows])

    def tail(self, count: int) -> int:
        rows = self.conn.execute(
            "SELECT body FROM raw_load ORDER BY seq DESC LIMIT %s", (count,)
        ).fetchall()
        return len([orjson.loads(body) for (body,) in rows])

    def prepare_listing(self, count: int) -> None:
        meta = orjson.dumps(to_dict(make_metadata("x"))).decode()
        with self.conn.cursor() as cursor, cursor.copy("COPY raw_threads FROM STDIN") as c:
            for index in range(count):
                c.write_row((f"t{index}", index, meta))

    def first_page(self) -> int:
        rows = self.conn.execute(
            "SELECT m FROM raw_threads ORDER BY updated DESC, id DESC LIMIT 50"
        ).fetchall()
        return len([orjson.loads(m) for (m,) in rows])

    def close(self) -> None:
        self.conn.close()
