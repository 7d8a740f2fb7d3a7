"""Counters for one kind of torture trial, and the table they print as."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

MAX_PROBLEMS = 20
"""How many problem descriptions a kind keeps (the counts keep counting)."""


@dataclass
class KindStats:
    """What one kind of trial did: trials, faults injected, commits, losses, recovery."""

    kind: str
    trials: int = 0
    faults: int = 0
    acked: int = 0
    lost: int = 0
    corrupt: int = 0
    recovery_ms: list[float] = field(default_factory=list)
    raw_ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def problem(self, text: str, *, lost: int = 0, corrupt: int = 0) -> None:
        """Count a loss or a corruption and keep its description."""
        self.lost += lost
        self.corrupt += corrupt
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    @property
    def ok(self) -> bool:
        """Return True when nothing was lost and nothing corrupt was seen."""
        return self.lost == 0 and self.corrupt == 0

    def recovery(self) -> tuple[float | None, float | None]:
        """Return the median and p99 recovery time in ms (None without samples)."""
        return median_p99(self.recovery_ms)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object ``--json`` writes for this kind."""
        med, p99 = self.recovery()
        return {
            "kind": self.kind,
            "trials": self.trials,
            "faults_injected": self.faults,
            "acknowledged_commits": self.acked,
            "commits_lost": self.lost,
            "corrupt_replays": self.corrupt,
            "recovery_ms_median": med,
            "recovery_ms_p99": p99,
            "raw_read_ms_median": median_p99(self.raw_ms)[0],
            "problems": self.problems,
            "notes": self.notes,
            "skipped": self.skipped,
        }


def median_p99(samples: list[float]) -> tuple[float | None, float | None]:
    """Return the median and the 99th percentile of ``samples`` (None when empty)."""
    if not samples:
        return None, None
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


HEADER = (
    "trial kind",
    "trials",
    "faults",
    "acked commits",
    "lost",
    "corrupt",
    "recovery ms (median / p99)",
    "raw read ms",
)


def table(kinds: list[KindStats]) -> str:
    """Return the kinds as an aligned text table (skipped kinds say why)."""
    rows: list[tuple[str, ...]] = [HEADER]
    for k in kinds:
        if k.skipped:
            rows.append((k.kind, "skipped: " + k.skipped, "", "", "", "", "", ""))
            continue
        med, p99 = k.recovery()
        recovery = "-" if med is None else f"{_fmt(med)} / {_fmt(p99)}"
        raw = _fmt(median_p99(k.raw_ms)[0])
        rows.append(
            (k.kind, str(k.trials), str(k.faults), str(k.acked), str(k.lost), str(k.corrupt))
            + (recovery, raw)
        )
    total = [k for k in kinds if not k.skipped]
    rows.append(
        (
            "total",
            str(sum(k.trials for k in total)),
            str(sum(k.faults for k in total)),
            str(sum(k.acked for k in total)),
            str(sum(k.lost for k in total)),
            str(sum(k.corrupt for k in total)),
            "",
            "",
        )
    )
    widths = [
        max(len(r[i]) for r in rows if not r[1].startswith("skipped")) for i in range(len(HEADER))
    ]
    lines = []
    for number, row in enumerate(rows):
        if row[1].startswith("skipped"):
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            pairs = zip(row[1:], widths[1:], strict=True)
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in pairs]
            lines.append("  ".join(cells))
        if number == 0 or number == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
