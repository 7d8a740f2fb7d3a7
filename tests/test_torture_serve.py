"""The torture suite's serve mode: ``roder serve`` SIGKILLed during runs and streams and
restarted; no accepted run lost, no streamed event duplicated, reordered or gapped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    importlib.util.find_spec("roder_server") is None, reason="roder-server is not installed"
)
def test_serve_kill_trials_lose_nothing(tmp_path: Path) -> None:
    from _torture.serve import run_serve_trials

    stats = run_serve_trials(2, tmp_path, seed=7)
    assert stats.trials == 2 and stats.faults == 2
    assert stats.ok, stats.problems
    assert stats.notes["stream_reconnects"] >= 1  # the stream did resume across a restart
    assert stats.notes["long_trials"] == 1  # one trial killed 80-200 events into its reply
