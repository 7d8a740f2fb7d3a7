"""benchmarks/openai_bench.py runs (--quick) and reports both figures with the difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]


def run_quick(script: str, out: Path, *args: str) -> tuple[str, list[dict[str, Any]]]:
    """Run ``benchmarks/<script> --quick --json out [args]``; return its output and rows."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(out.read_text())["rows"]
    return result.stdout, rows


def test_the_bench_reports_time_to_first_delta_direct_and_through_roder(tmp_path: Path) -> None:
    _, rows = run_quick("openai_bench.py", tmp_path / "bench.json")
    assert [r["workload"] for r in rows] == [
        "O1 direct, one message",
        "O1 roder serve, new conversation",
        "O1 direct, the whole conversation",
        "O1 roder serve, one conversation",
    ]
    assert all(r["n"] == 10 and r["p50_ms"] > 0 for r in rows)
    # Each Roder row is measured against the baseline row before it.
    assert rows[0]["added_p50_ms"] == 0 and rows[2]["added_p50_ms"] == 0
    assert rows[1]["added_p50_ms"] == rows[1]["p50_ms"] - rows[0]["p50_ms"]
    assert rows[3]["added_p50_ms"] == rows[3]["p50_ms"] - rows[2]["p50_ms"]
    assert rows[0]["added_paired_p50_ms"] == 0 and rows[2]["added_paired_p50_ms"] == 0
    assert all(isinstance(r["added_paired_p50_ms"], float) for r in rows)
    assert rows[1]["server_cpu_ms_per_response"] > 0 and rows[3]["server_cpu_ms_per_response"] > 0


def test_serve_bench_reports_the_same_rows(tmp_path: Path) -> None:
    """``serve_bench.py`` carries the SDK's time to first delta too (``--only openai``)."""
    stdout, rows = run_quick("serve_bench.py", tmp_path / "serve.json", "--only", "openai")
    assert [r["workload"] for r in rows][1::2] == [
        "O1 roder serve, new conversation",
        "O1 roder serve, one conversation",
    ]
    assert all(r["met"] in (True, False) and r["added_paired_p50_ms"] != 0 for r in rows[1::2])
    assert "SDK time to first delta" in stdout
