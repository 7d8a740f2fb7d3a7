"""Open turns in the JSONL store: the index column the pending-input query reads, folded
by the writer and by a scan alike, and an index of version 1 (no column) rebuilt once when
a store that writes opens it — or left untouched, the answer built in memory, read-only
(the kit's ``OpenTurnsUpgradeChecks``)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, ClassVar

import pytest

from roder_api.events import InputAccepted, TurnComplete
from roder_api.testing.conformance import OpenTurnsUpgradeChecks
from roder_api.threads import ThreadStoreFactory
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._index import INDEX_VERSION

pytestmark = [pytest.mark.core]


_INDEX_FILES = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm")


def _index_path(factory: ThreadStoreFactory) -> Path:
    assert isinstance(factory, JsonlThreadStoreFactory)
    return factory.base_path / "index.sqlite3"


class TestJsonlOpenTurns(OpenTurnsUpgradeChecks):
    """The kit's open-turn checks on the JSONL store's index, version 1 -> 2."""

    older_version: ClassVar[int] = 1
    current_version: ClassVar[int] = INDEX_VERSION

    @pytest.fixture
    def thread_store_factory(self, factory: JsonlThreadStoreFactory) -> JsonlThreadStoreFactory:
        """Return the conftest's factory of an empty store."""
        return factory

    def read_only_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory:
        """Return a read-only factory of the same directory."""
        assert isinstance(factory, JsonlThreadStoreFactory)
        return JsonlThreadStoreFactory(factory.base_path, read_only=True)

    def as_older_version(self, factory: ThreadStoreFactory) -> None:
        """Turn the index back into what version 1 wrote: no column, no metadata field."""
        with closing(sqlite3.connect(_index_path(factory), isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DROP INDEX threads_open")
            db.execute("ALTER TABLE threads DROP COLUMN open_turns")
            for thread_id, raw in db.execute("SELECT thread_id, meta FROM threads").fetchall():
                older = self.older_metadata(raw).encode()
                db.execute("UPDATE threads SET meta = ? WHERE thread_id = ?", (older, thread_id))
            db.execute("UPDATE info SET value = '1' WHERE key = 'version'")
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def stored_version(self, factory: ThreadStoreFactory) -> int:
        """Return the index's version."""
        with closing(sqlite3.connect(_index_path(factory))) as db:
            return int(db.execute("SELECT value FROM info WHERE key = 'version'").fetchone()[0])

    def stored_open_turns(self, factory: ThreadStoreFactory) -> dict[str, int] | None:
        """Return the index's open_turns values (None: no such column)."""
        with closing(sqlite3.connect(_index_path(factory))) as db:
            columns = [row[1] for row in db.execute("PRAGMA table_info(threads)")]
            if "open_turns" not in columns:
                return None
            return dict(db.execute("SELECT thread_id, open_turns FROM threads"))

    def stored_state(self, factory: ThreadStoreFactory) -> object:
        """Return every file of the store, by its path."""
        base = _index_path(factory).parent
        return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}

    async def check_older_reader(self, reader: Any, threads: dict[str, str]) -> None:
        """Built in memory from the journals: the open turn is folded into the metadata."""
        assert (await reader.get_thread(threads["pending"])).open_turns == ("r1",)

    async def test_a_scan_folds_what_another_store_appended(
        self, factory: JsonlThreadStoreFactory
    ) -> None:
        threads = await self.store_open_turn_threads(factory)
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
        index = _index_path(factory)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)  # noqa: ASYNC240 - test setup
        store = await factory.open()
        try:
            assert await store.threads_with_pending_input() == []
            await store.append_events(threads["ended"], [InputAccepted("b", "more")])
            assert await store.threads_with_pending_input() == [threads["ended"]]
        finally:
            await store.aclose()

    async def test_an_upgrade_leaves_no_old_index_behind(
        self, factory: JsonlThreadStoreFactory
    ) -> None:
        # An older index is not damage: once rebuilt, nothing of it is kept beside the new.
        threads = await self.store_open_turn_threads(factory)
        self.as_older_version(factory)
        store = await factory.open()
        try:
            assert await store.threads_with_pending_input() == [threads["pending"]]
        finally:
            await store.aclose()
        names = sorted(p.name for p in factory.base_path.glob("index.sqlite3*"))
        assert [n for n in names if n not in _INDEX_FILES] == []
        assert self.stored_version(factory) == INDEX_VERSION
