"""The tool-loop and observer workloads of benchmarks/turn_bench.py run and report figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .conftest import REPO


def turn_bench(*args: str, env: dict[str, str] | None = None) -> Any:
    """Run benchmarks/turn_bench.py ``--quick --json`` with ``args``; return its report."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "turn_bench.py"), *args, "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_tool_loop_workload_reports_overhead_next_to_the_appends() -> None:
    report = turn_bench("--tools", "--steps", "5")
    assert report["steps"] == 5 and len(report["runs"]) == 1
    assert report["median_ms_per_step"] > 0 and report["raw_append_ms_per_step"] > 0
    assert report["appends_per_step"] >= 1  # every tool step is journaled durably
    assert "runtime_overhead_ms_per_step" in report


def test_observer_workload_runs_each_case_and_the_export_happens() -> None:
    # The bench itself refuses to report when roder-otel registered an observer while
    # unconfigured, or when the exporting case did not export the turn's two spans.
    report = turn_bench(
        "--observers",
        "--durability",
        "none",
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert [row["case"] for row in report["rows"]] == [
        "no observer plugin",
        "roder-otel installed, not configured",
        "roder-otel exporting (in-memory)",
    ]
    assert all(row["median_cpu_seconds"] > 0 for row in report["rows"])
