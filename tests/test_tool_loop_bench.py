"""The tool-loop workload of benchmarks/turn_bench.py runs and reports per-step figures."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO


def test_tool_loop_workload_reports_overhead_next_to_the_appends() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "turn_bench.py"),
            "--tools",
            "--quick",
            "--json",
            "--steps",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["steps"] == 5 and len(report["runs"]) == 1
    assert report["median_ms_per_step"] > 0 and report["raw_append_ms_per_step"] > 0
    assert report["appends_per_step"] >= 1  # every tool step is journaled durably
    assert "runtime_overhead_ms_per_step" in report
