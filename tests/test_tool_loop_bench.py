"""The tool-loop and observer workloads of benchmarks/turn_bench.py run and report figures."""

from __future__ import annotations

import json
import os
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


def test_observer_workload_runs_each_case_and_the_export_happens() -> None:
    # The bench itself refuses to report when roder-otel registered an observer while
    # unconfigured, or when the exporting case did not export the turn's two spans.
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "turn_bench.py"),
            "--observers",
            "--quick",
            "--json",
            "--durability",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [row["case"] for row in report["rows"]] == [
        "no observer plugin",
        "roder-otel installed, not configured",
        "roder-otel exporting (in-memory)",
    ]
    assert all(row["median_cpu_seconds"] > 0 for row in report["rows"])
