"""Lease trials of the torture suite, bounded: a holder whose PostgreSQL lease connection
is ended under it stops writing and is taken over; a SIGKILLed holder's forked child does
not keep the thread (``benchmarks/_torture/leases.py`` says what is counted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _torture import leases
from _torture.stores import StoreSpec

from .postgres_support import require_postgres, temporary_schema

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the trials drive real processes; one backend is enough here


async def test_a_holder_that_loses_its_postgres_lease_connection_is_fenced(
    tmp_path: Path,
) -> None:
    dsn = require_postgres()
    with temporary_schema("torture_lease") as schema:
        spec = StoreSpec("postgres", "postgres", {"dsn": dsn, "schema": schema})
        stats = await leases.run_lease_lost_trials(spec, 2, tmp_path, seed=3)
    assert stats.trials == 2 and stats.faults == 2, "the lease connection was not ended"
    assert stats.acked > 0
    assert stats.problems == [] and stats.ok


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
async def test_a_forked_child_never_keeps_a_killed_holders_lease(
    tmp_path: Path, backend: str
) -> None:
    if backend == "postgres":
        dsn = require_postgres()
        with temporary_schema("torture_fork") as name:
            spec = StoreSpec("postgres", "postgres", {"dsn": dsn, "schema": name})
            stats = await leases.run_forked_child_trials(spec, 1, tmp_path, seed=4)
    else:
        where = tmp_path / "store"
        settings = {"path": str(where / "roder.db" if backend == "sqlite" else where)}
        spec = StoreSpec(backend, backend, settings)
        stats = await leases.run_forked_child_trials(spec, 1, tmp_path / "work", seed=4)
    assert stats.trials == 1 and stats.faults == 1, "the forked job did not outlive its holder"
    assert stats.problems == [] and stats.ok
