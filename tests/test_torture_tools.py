"""Tool crash trials: agent loops SIGKILLed in their tool steps never run a tool twice.

A bounded number of kills; ``benchmarks/torture.py`` runs 300 in its full run. The
machinery is ``benchmarks/_torture/tools.py`` (its docstring says what is counted).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _torture import tools

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_killed_tool_steps_never_run_a_tool_twice_and_leave_no_call_unanswered(
    tmp_path: Path,
) -> None:
    stats = await tools.run_tool_crash_trials(4, tmp_path, seed=11, max_delay=0.8)
    assert stats.trials == 4 and stats.faults >= 3, "the children were not killed mid-run"
    assert stats.notes["tool_calls"] > 0
    assert stats.notes["non_idempotent_run_twice"] == 0
    assert stats.notes["calls_without_result"] == 0
    assert stats.notes["bad_replays"] == 0
    assert stats.problems == [] and stats.ok
