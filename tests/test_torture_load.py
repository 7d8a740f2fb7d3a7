"""Load: many concurrent streams on one runtime lose and reorder nothing.

A bounded version of the load section of ``benchmarks/torture.py`` (which reports the
throughput and latency figures): every thread's journal must equal exactly what its
consumer received, and every turn's text what the engine produced.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _torture.load import run_load

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("durability", ["fsync", "group"])
async def test_concurrent_streams_lose_and_reorder_nothing(tmp_path: Path, durability: str) -> None:
    result = await run_load(tmp_path, sessions=24, seconds=0.5, durability=durability, deltas=12)
    assert result.turns >= 24
    assert result.events > result.turns * 3
    assert result.problems == []
    assert result.lost == 0 and result.reordered == 0
    assert len(result.yield_to_deliver_ms) > 0
