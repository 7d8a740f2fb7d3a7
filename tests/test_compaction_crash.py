"""Crash safety of compaction: real child processes killed with SIGKILL at random points.

Each trial hands a warmed-up child (``_compaction_crash_child.py``) a thread to compact and
kills it: either after a random delay spread over the whole compaction, or a random moment
(0-3 ms) after the child announced that it is about to write the commit batch. After every
kill a new ``Runtime`` on the same directory must load the thread with either the original
history or the original history plus exactly one boundary, and billed usage never goes down.
A thread is compacted (and killed) again until a boundary lands, then the next thread starts.

In CI the test is bounded (``RODER_CRASH_TRIALS`` trials, default 150, within
``RODER_CRASH_SECONDS``, default 40 s). Run more trials with
``python tests/test_compaction_crash.py --trials 500`` (prints the outcome table).
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ItemCompleted,
)
from roder_api.testing import ScriptedEngine
from roder_api.transcript import (
    AssistantMessage,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime

CHILD = Path(__file__).with_name("_compaction_crash_child.py")

ORIGINAL: list[TranscriptItem] = [
    UserMessage("keep this goal"),
    AssistantMessage("noted"),
    UserMessage("and this request"),
    AssistantMessage("done"),
]


def runtime_on(base: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    return Runtime(builder.build())


@dataclass
class ThreadState:
    """What the parent knows of one thread across kills."""

    thread_id: str
    usage: int = 0
    kills: int = 0


@dataclass
class Report:
    """Counts of trials by how they were killed and what the reloaded thread held."""

    trials: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)
    threads: int = 0
    max_kills_on_one_thread: int = 0
    seconds: float = 0.0

    def table(self) -> str:
        lines = [
            f"compaction crash test: {self.trials} SIGKILL trials on {self.threads} threads "
            f"in {self.seconds:.1f} s (up to {self.max_kills_on_one_thread} kills on a thread)",
            "  killed at (what the child had announced):",
        ]
        lines += [f"    {k:<28} {v:>5}" for k, v in sorted(self.phases.items())]
        lines.append("  reloaded thread:")
        lines += [f"    {k:<28} {v:>5}" for k, v in sorted(self.outcomes.items())]
        return "\n".join(lines)


class Child:
    """A child process whose stdout lines are read by a thread into a queue."""

    def __init__(self, base: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), str(base)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def read_line(self, timeout: float = 30) -> str | None:
        """Return the next line, or None at the end of output (or on timeout)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def finish(self) -> list[str]:
        """Reap the child; return the rest of what it printed."""
        self.process.wait(timeout=30)
        self.reader.join(timeout=30)
        rest = []
        while (line := self.read_line(0)) is not None:
            rest.append(line)
        assert self.process.stdout is not None and self.process.stdin is not None
        self.process.stdout.close()
        try:
            self.process.stdin.close()
        except BrokenPipeError:  # the child is dead: nothing left to flush
            pass
        return rest


async def create_thread(base: Path) -> ThreadState:
    async with runtime_on(base) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.append_events(thread_id, [ItemCompleted("t0", i) for i in ORIGINAL])
    return ThreadState(thread_id)


async def inspect(base: Path, state: ThreadState) -> tuple[str, bool]:
    """Check the invariants on a fresh runtime; return (outcome, has boundary)."""
    async with runtime_on(base) as runtime:
        snapshot = await runtime.load_thread(state.thread_id)
        assert snapshot is not None
        items = snapshot.items
        boundaries = [i for i in items if is_compaction_boundary(i)]
        assert items[: len(ORIGINAL)] == ORIGINAL, items
        assert items in (ORIGINAL, [*ORIGINAL, *boundaries]) and len(boundaries) <= 1, items
        replay = await runtime.replay_history(state.thread_id)
        assert replay == (boundaries if boundaries else ORIGINAL)
        usage = snapshot.metadata.usage.total_tokens
        assert usage >= state.usage, f"billed usage went down: {state.usage} -> {usage}"
        by_purpose = await runtime.usage_by_purpose(state.thread_id)
        assert sum(u.total_tokens for u in by_purpose.values()) == usage
        state.usage = usage
        events = [e.event for e in await (await runtime.store()).read_events(state.thread_id)]
    tail = events[len(ORIGINAL) :]
    last = [e for e in tail if isinstance(e, (CompactionStarted, CompactionDiscarded))]
    if boundaries:
        assert isinstance(tail[-1], CompactionCommitted)
        return "original + one boundary", True
    if not last:
        return "original (nothing journaled)", False
    if isinstance(last[-1], CompactionDiscarded):
        return "original (discarded)", False
    return "original (compaction open)", False


def run_trials(base: Path, trials: int, seconds: float, seed: int = 0) -> Report:
    rng = random.Random(seed)
    report = Report()
    started = time.monotonic()
    base.mkdir(parents=True, exist_ok=True)
    # Calibrate the kill window: time one full, unkilled compaction.
    state = anyio.run(create_thread, base)
    report.threads += 1
    calibration = Child(base)
    assert calibration.read_line() == "ready"
    t0 = time.monotonic()
    calibration.send(f"go {state.thread_id} 1\n")
    lines = []
    while (line := calibration.read_line()) is not None:
        lines.append(line)
        if line == "done":
            break
    window = time.monotonic() - t0
    calibration.finish()
    assert lines[-1] == "done", lines
    assert anyio.run(inspect, base, state)[1]
    state = anyio.run(create_thread, base)
    report.threads += 1
    spare = Child(base)
    while report.trials < trials and time.monotonic() - started < seconds:
        child, spare = spare, Child(base)  # warm the next child while this one runs
        assert child.read_line() == "ready"
        child.send(f"go {state.thread_id} {rng.randrange(1 << 30)}\n")
        seen: list[str] = []
        if rng.random() < 0.5:
            # Anywhere in the compaction (and a little after it).
            time.sleep(rng.uniform(0, window * 1.3))
        else:
            # Right before, during or right after the commit write.
            while (line := child.read_line()) is not None:
                seen.append(line)
                if line == "commit":
                    break
            time.sleep(rng.choice([0.0, rng.uniform(0, 0.003)]))
        child.process.send_signal(signal.SIGKILL)
        seen += child.finish()
        report.trials += 1
        state.kills += 1
        if child.process.returncode != -signal.SIGKILL:
            phase = "after exit (not killed)"
        elif "committed" in seen:
            phase = "after commit write"
        elif "commit" in seen:
            phase = "during commit write"
        else:
            phase = "before commit write"
        report.phases[phase] += 1
        outcome, compacted = anyio.run(inspect, base, state)
        report.outcomes[outcome] += 1
        if phase in ("after commit write", "after exit (not killed)"):
            assert compacted, "an acknowledged commit was lost"
        if compacted:
            report.max_kills_on_one_thread = max(report.max_kills_on_one_thread, state.kills)
            state = anyio.run(create_thread, base)
            report.threads += 1
    spare.process.kill()
    spare.finish()
    report.seconds = time.monotonic() - started
    return report


@pytest.mark.slow
def test_compaction_survives_sigkill_at_random_points(tmp_path: Path) -> None:
    trials = int(os.environ.get("RODER_CRASH_TRIALS", "150"))
    seconds = float(os.environ.get("RODER_CRASH_SECONDS", "40"))
    report = run_trials(tmp_path / "store", trials, seconds)
    print("\n" + report.table())
    assert report.trials >= min(trials, 10)
    assert report.outcomes["original + one boundary"] > 0
    assert sum(v for k, v in report.outcomes.items() if k.startswith("original (")) > 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run the compaction SIGKILL trials.")
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=3600)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        print(
            run_trials(
                Path(directory) / "store", options.trials, options.seconds, options.seed
            ).table()
        )
