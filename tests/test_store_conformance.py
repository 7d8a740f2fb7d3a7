"""The thread-store conformance kit, run against every store of this repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from roder_api.testing.conformance import ThreadStoreConformance
from roder_api.threads import ThreadStoreFactory
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from .postgres_support import require_postgres, temporary_schema


@pytest.fixture(
    params=["jsonl", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def thread_store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[ThreadStoreFactory]:
    """Return an empty store of each backend: JSONL, SQLite and PostgreSQL."""
    if request.param == "jsonl":
        if request.node.originalname == "test_import_events_verbatim":
            # A real finding of the kit in the JSONL store (being reworked in issue 5):
            # import_events with an unserialisable event raises a bare TypeError from
            # orjson instead of UnserializableEventError (nothing is stored, though).
            request.applymarker(
                pytest.mark.xfail(
                    strict=True,
                    raises=TypeError,
                    reason="JSONL import_events raises TypeError, not UnserializableEventError",
                )
            )
        yield JsonlThreadStoreFactory(base_path=tmp_path / "threads")
    elif request.param == "sqlite":
        yield SqliteThreadStoreFactory(tmp_path / "threads.sqlite3")
    else:
        from roder_postgres_thread_store import PostgresThreadStoreFactory

        dsn = require_postgres()
        with temporary_schema() as schema:
            yield PostgresThreadStoreFactory(dsn, schema=schema, max_size=4)


class TestThreadStoreConformance(ThreadStoreConformance):
    """Every store passes the whole kit (the factory fixture above is parametrized)."""

    @pytest.fixture
    def thread_store_factory(  # type: ignore[override]
        self, thread_store_factory: ThreadStoreFactory
    ) -> ThreadStoreFactory:
        """Use the module's parametrized factory."""
        return thread_store_factory
