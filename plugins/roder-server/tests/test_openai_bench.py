"""benchmarks/openai_bench.py runs (--quick) and reports both figures with the difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def test_the_bench_reports_time_to_first_delta_direct_and_through_roder(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "openai_bench.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"].split(",")[0] for r in rows] == [
        "O1 direct to the engine's server",
        "O1 roder serve",
        "O1 roder serve",
    ]
    assert all(r["n"] == 10 and r["p50_ms"] > 0 for r in rows)
    assert rows[0]["added_p50_ms"] == 0
