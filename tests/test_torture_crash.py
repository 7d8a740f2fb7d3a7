"""Crash trials: real child processes killed with SIGKILL at random moments lose nothing.

A few bounded trials per store and mode; ``benchmarks/torture.py`` runs the 1,000+ of the
full suite and prints the figures. The machinery (children, acknowledgements, checks) is
shared with it: see ``benchmarks/_torture/crash.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from _torture import crash
from _torture.stores import StoreSpec, installed_backends, jsonl_specs, postgres_dsn

from roder_runtime import Runtime

pytestmark = pytest.mark.anyio


def _specs(base: Path) -> list[StoreSpec]:
    return jsonl_specs(str(base))


@pytest.mark.parametrize("mode", ["fsync", "group", "none"])
async def test_killed_appenders_lose_nothing(tmp_path: Path, mode: str) -> None:
    (spec,) = [s for s in _specs(tmp_path / "stores") if s.name == f"jsonl-{mode}"]
    stats = await crash.run_crash_trials("append", spec, 4, tmp_path / "work", seed=7)
    assert stats.trials == stats.faults == 4
    assert stats.acked > 0, "the children committed nothing before being killed"
    assert stats.problems == []
    assert stats.ok


async def test_killed_turns_lose_nothing(tmp_path: Path) -> None:
    mode = "session" if hasattr(Runtime, "start_session") else "turn"
    spec = _specs(tmp_path / "stores")[0]
    stats = await crash.run_crash_trials(mode, spec, 3, tmp_path / "work", seed=3, max_delay=0.3)
    assert stats.acked > 0
    assert stats.problems == []


async def test_killed_compactions_lose_nothing(tmp_path: Path) -> None:
    if not hasattr(Runtime, "compact_with_provider"):
        pytest.skip("Runtime.compact_with_provider has not landed yet")
    spec = _specs(tmp_path / "stores")[0]
    stats = await crash.run_crash_trials(
        "compact", spec, 3, tmp_path / "work", seed=5, max_delay=0.3
    )
    assert stats.acked > 0
    assert stats.problems == []


async def test_killed_in_turn_compactions_lose_nothing(tmp_path: Path) -> None:
    """Sessions whose steps stream a boundary, SIGKILLed: commits are whole or absent."""
    spec = _specs(tmp_path / "stores")[0]
    stats = await crash.run_crash_trials(
        "inturn", spec, 6, tmp_path / "work", seed=13, max_delay=0.4
    )
    print(f"in-turn crash trials: {stats.trials}, lost {stats.lost}, corrupt {stats.corrupt}")
    assert stats.trials == 6 and stats.acked > 0
    assert stats.problems == []
    assert stats.lost == 0 and stats.corrupt == 0


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_killed_appenders_lose_nothing_on_databases(tmp_path: Path, backend: str) -> None:
    if backend not in installed_backends():
        pytest.skip(f"the {backend} store is not installed")
    if backend == "sqlite":
        spec = StoreSpec("sqlite", "sqlite", {"path": str(tmp_path / "roder.db")})
    else:
        dsn = postgres_dsn()
        if not dsn:
            pytest.skip("no PostgreSQL DSN (RODER_POSTGRES_DSN)")
        spec = StoreSpec("postgres", "postgres", {"dsn": dsn, "schema": f"t_{tmp_path.name}"})
    stats = await crash.run_crash_trials("append", spec, 3, tmp_path / "work", seed=11)
    assert stats.acked > 0
    assert stats.problems == []


async def test_the_checks_catch_a_lost_commit(tmp_path: Path) -> None:
    """The checks are not vacuous: cutting a committed record off is counted.

    The JSONL store itself now refuses a journal shorter than its index says (damage of the
    kind ``truncated``), so the cut shows as corrupt; a store that did not notice would
    show it as lost. Either way it is counted, never passed as healthy."""
    spec = _specs(tmp_path / "stores")[0]
    states = await crash.create_threads(spec, 1)
    (thread_id,) = states
    stats = crash.KindStats("append / cut")
    ctx = crash.mp_context()
    acks: list[dict[str, object]] = []
    for attempt in range(5):
        ack_path = tmp_path / f"acks{attempt}.jsonl"
        job = crash.ChildJob("append", spec, (thread_id,), str(ack_path), seed=attempt)
        # Killed after it is ready (no early kill), so that it commits something.
        await anyio.to_thread.run_sync(
            crash._run_child_and_kill, ctx, job, random.Random(attempt), 0.05, 0.0
        )
        acks = [a for a in crash.read_acks(ack_path) if "log" not in a]
        if acks:
            break
    assert acks, "the child committed nothing"
    crash.record_acks("append", acks, states)
    await crash.verify(stats, spec, "append", states)
    assert stats.ok, stats.problems
    store = await spec.factory().open()
    journal = anyio.Path(store.journal_path(thread_id))  # type: ignore[attr-defined]
    await store.aclose()
    lines = (await journal.read_bytes()).splitlines(keepends=True)
    complete = [line for line in lines if line.endswith(b"\n")]
    await journal.write_bytes(b"".join(complete[:-1]))  # a committed record disappears
    await crash.verify(stats, spec, "append", states)
    assert stats.lost + stats.corrupt >= 1
    assert not stats.ok


def test_the_in_turn_check_catches_half_a_commit() -> None:
    """The in-turn check is not vacuous: a boundary without its commit and step is corrupt."""
    from _torture.inturn import check_inturn_commits

    from roder_api.events import (
        CompactionCommitted,
        ItemCompleted,
        JournalEvent,
        TurnComplete,
        UsageUpdated,
    )
    from roder_api.inference import TokenUsage
    from roder_api.threads import ThreadMetadata
    from roder_api.transcript import AssistantMessage, ProviderMetadata

    boundary = ProviderMetadata({"output": [{"type": "compaction", "id": "cmp_1"}]})

    def journal(*events: object) -> list[JournalEvent]:
        return [JournalEvent(n, 0, e) for n, e in enumerate(events, 1)]  # type: ignore[arg-type]

    def problems(events: list[JournalEvent]) -> list[str]:
        stats = crash.KindStats("inturn / check")
        check_inturn_commits(stats, "t", crash.ThreadState(), ThreadMetadata("t", 0, 0), events)
        return stats.problems

    whole = journal(
        ItemCompleted("a", boundary),
        CompactionCommitted("a"),
        ItemCompleted("a", AssistantMessage("hi")),
        TurnComplete("a", "hi"),
    )
    assert problems(whole) == []
    assert problems(journal(ItemCompleted("a", boundary), UsageUpdated("a", TokenUsage())))
    assert problems(journal(ItemCompleted("a", boundary), CompactionCommitted("a")))
    assert problems(journal(CompactionCommitted("a")))
