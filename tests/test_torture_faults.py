"""Disk faults: failing writes and syncs (EIO, ENOSPC), short writes, a really full disk.

The store must raise a ``StoreError`` saying what happened, leave nothing of the failed
commit visible, keep every earlier commit, and commit again once the fault is gone. EIO and
short writes are injected in a child process by wrapping ``os.write`` / ``os.fsync`` before
the store is imported; ENOSPC also comes for real from a small tmpfs mounted by the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _torture import faults
from _torture.stores import StoreSpec

pytestmark = pytest.mark.anyio


def _jsonl(path: Path, durability: str = "fsync") -> StoreSpec:
    return StoreSpec(f"jsonl-{durability}", "jsonl", {"path": str(path), "durability": durability})


@pytest.mark.parametrize("durability", ["fsync", "group"])
async def test_injected_write_and_sync_faults(tmp_path: Path, durability: str) -> None:
    results = await faults.run_injected_faults(_jsonl(tmp_path / "store", durability), 1, seed=3)
    assert {r.kind.split(" / ")[0] for r in results} == set(faults.INJECTED_FAULTS)
    for stats in results:
        assert stats.trials == 1, stats.kind
        assert stats.faults >= 1, f"{stats.kind}: no fault was injected"
        assert stats.problems == [], stats.kind


async def test_a_really_full_disk(tmp_path: Path) -> None:
    stats = await faults.run_enospc(lambda path: _jsonl(path), tmp_path / "tmpfs", 2, seed=5)
    if stats.skipped:
        pytest.skip(f"no tmpfs here: {stats.skipped}")
    assert stats.trials >= 1
    assert stats.faults >= 1, "the disk never filled up"
    assert stats.problems == []
