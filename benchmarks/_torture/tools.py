"""Tool crash trials: agent loops killed with SIGKILL at random points of their tool steps.

Each thread gets a chain of children (``tool_child.py``): each runs turns of tool steps
until the parent kills it with SIGKILL after a random delay; the next child resumes the
thread (finishing the tool step the last one left) and is killed in turn; a last child
only finishes what is left. Then the thread is checked:

- **non-idempotent tools run twice**: a ``note`` call id that ``runs.log`` shows twice (must
  be 0: a started call without a result is never run again);
- **calls without a result** after the last resume (must be 0);
- **journals replaying a call without its result** to the engine: requests the engine saw
  with an unanswered call in their transcript (must be 0).

Idempotent calls re-run after a crash (``probe``) are counted too, as a note.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import anyio.to_thread

from _torture.stats import KindStats
from roder_api import ExtensionRegistryBuilder
from roder_api.events import ItemCompleted
from roder_api.transcript import ToolCallRecord, ToolResultRecord
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

CHILD = Path(__file__).with_name("tool_child.py")
KILLS_PER_THREAD = 10
"""SIGKILLs in a row on one thread before it is finished and checked."""


def _run_child(store: Path, work: Path, thread_id: str, delay: float | None) -> bool:
    """Run one child; kill it ``delay`` seconds after it is ready (None: let it finish).

    Return True when the child was killed (it was still running at the deadline).
    """
    args = [sys.executable, str(CHILD), str(store), str(work), thread_id]
    if delay is None:
        args.append("--finish")
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        ready = child.stdout.readline()
        if delay is None or "ready" not in ready:
            _, err = child.communicate(timeout=120)
            if child.returncode != 0:
                raise RuntimeError(f"the tool child failed ({child.returncode}): {err[-2000:]}")
            return False
        time.sleep(delay)
        killed = child.poll() is None
        child.kill()
        child.wait(30)
        return killed


async def _check(store: Path, work: Path, thread_id: str, stats: KindStats) -> None:
    builder = ExtensionRegistryBuilder().thread_store_factory(JsonlThreadStoreFactory(store))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        page = await runtime.event_page(thread_id, limit=1_000_000)
    events = [e.event for e in page.events]
    calls = [
        e.item.id
        for e in events
        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolCallRecord)
    ]
    answered = {
        e.item.id
        for e in events
        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord)
    }
    unanswered = [c for c in calls if c not in answered]
    runs_log = work / "runs.log"
    runs = Counter(runs_log.read_text().split("\n")) if runs_log.exists() else Counter()
    twice = [line for line, n in runs.items() if line.startswith("note ") and n > 1]
    reran = sum(1 for line, n in runs.items() if line.startswith("probe ") and n > 1)
    bad_log = work / "bad_replay.log"
    bad = len(bad_log.read_text().splitlines()) if bad_log.exists() else 0
    notes = stats.notes
    notes["tool_calls"] = notes.get("tool_calls", 0) + len(calls)
    notes["non_idempotent_run_twice"] = notes.get("non_idempotent_run_twice", 0) + len(twice)
    notes["calls_without_result"] = notes.get("calls_without_result", 0) + len(unanswered)
    notes["bad_replays"] = notes.get("bad_replays", 0) + bad
    notes["idempotent_reruns"] = notes.get("idempotent_reruns", 0) + reran
    stats.acked += len(answered)
    if twice:
        stats.problem(f"{thread_id}: non-idempotent calls ran twice: {twice[:5]}", lost=len(twice))
    if unanswered:
        stats.problem(
            f"{thread_id}: calls without a result: {unanswered[:5]}", lost=len(unanswered)
        )
    if bad:
        stats.problem(
            f"{thread_id}: {bad} requests replayed a call without its result", corrupt=bad
        )


async def run_tool_crash_trials(
    trials: int, workdir: Path, *, seed: int = 0, max_delay: float = 1.0
) -> KindStats:
    """Run ``trials`` SIGKILLs of tool-running children; return the counts (see above)."""
    rng = random.Random(seed)
    stats = KindStats("tools / jsonl-fsync")
    store = workdir / "store"
    done = 0
    thread_number = 0
    while done < trials:
        thread_number += 1
        thread_id = f"tools-{seed}-{thread_number}"
        work = workdir / thread_id
        work.mkdir(parents=True, exist_ok=True)
        for _ in range(min(KILLS_PER_THREAD, trials - done)):
            delay = rng.uniform(0.05, max_delay)
            killed = await anyio.to_thread.run_sync(_run_child, store, work, thread_id, delay)
            stats.trials += 1
            stats.faults += int(killed)
            done += 1
        began = time.perf_counter()
        await anyio.to_thread.run_sync(_run_child, store, work, thread_id, None)
        stats.recovery_ms.append((time.perf_counter() - began) * 1000)
        await _check(store, work, thread_id, stats)
    return stats
