"""The torture suite's serve mode: ``roder serve`` SIGKILLed during runs and streams and
restarted, on each store (JSONL, SQLite, PostgreSQL); no accepted run lost, no streamed
event duplicated, reordered or gapped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("roder_server") is None, reason="roder-server is not installed"
    ),
]

TRIALS = 2
"""Kill trials per store here (one long, one short); the full run has 200 per store."""


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_serve_kill_trials_lose_nothing(tmp_path: Path, backend: str) -> None:
    from _torture.serve import run_serve_trials, serve_backends

    dsn = dict(serve_backends()).get(backend)
    if dsn is None:
        pytest.skip(f"the {backend} store is not available here")
    stats = run_serve_trials(TRIALS, tmp_path, seed=7, backend=backend, dsn=dsn)
    assert stats.kind == f"serve / {backend}"
    assert stats.trials == TRIALS and stats.faults == TRIALS
    assert stats.ok, stats.problems
    assert stats.notes["stream_reconnects"] >= 1  # the stream did resume across a restart
    assert stats.notes["long_trials"] == 1  # one trial killed 80-200 events into its reply
