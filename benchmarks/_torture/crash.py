"""Crash trials: children committing to a store are SIGKILLed at random moments.

After every kill the parent opens the store afresh (as a restarted process would) and
checks it against what the child acknowledged:

- every acknowledged commit is present, at the sequence it was given (else: *lost*);
- nothing once visible disappears later, no half batch is visible, sequence numbers are
  consecutive from 1, metadata agrees with the journal (usage, counts, last sequence),
  replay starts exactly at the last compaction boundary, and billed usage never decreases
  (else: *corrupt*).

Recovery time is the time the fresh store takes to open and read every trial thread back.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import time
import uuid
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from pathlib import Path

import anyio
import anyio.to_thread
import orjson

from roder_api.errors import RoderError
from roder_api.events import JournalEvent
from roder_api.threads import ThreadMetadata, ThreadStore

# The session and compaction modes register their checks when imported.
from . import inturn as inturn  # noqa: F401
from . import sessions as sessions  # noqa: F401
from .checks import CHECKERS, ThreadState, check_journal, read_acks, record_acks
from .child import child_entry
from .jobs import ChildJob
from .stats import KindStats
from .stores import StoreSpec

MODES = ("append", "turn", "session", "compact", "inturn")
"""The crash-trial modes: raw appends, turns (run_turn), sessions, compaction, in-turn
compaction."""

THREADS_PER_CHILD = 2
"""Threads a child writes to (its writers share them)."""

ROTATE_EVERY = 20
"""Trials after which a kind moves to fresh threads (keeps verification cheap)."""

EARLY_KILL_FRACTION = 0.15
"""Share of trials killed without waiting for the child to be ready (during open/recovery)."""


def mp_context(method: str = "forkserver") -> BaseContext:
    """Return the multiprocessing context children are started from.

    ``forkserver`` (default) forks each child from a clean server process that has already
    imported Roder, so a trial costs milliseconds instead of an interpreter start; every
    child is still a separate process killed with a real SIGKILL. ``spawn`` starts a fresh
    interpreter per child.
    """
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["_torture.child", "roder_runtime", "trio"])
    return ctx


SETTLE_S = 5.0
"""How long :func:`settled_read` rereads a thread whose reads disagree."""


async def settled_read(
    store: ThreadStore, thread_id: str
) -> tuple[ThreadMetadata, list[JournalEvent], list[JournalEvent]]:
    """Read a thread's metadata, events and replay until the three agree on its last sequence.

    A database server may finish a commit that its killed client had sent (and never saw
    acknowledged) after the kill; reads taken while it lands disagree by that commit. A
    store at rest agrees at once; one that still disagrees after :data:`SETTLE_S` is judged
    as read the last time.
    """
    deadline = time.monotonic() + SETTLE_S
    while True:
        metadata = await store.get_thread(thread_id)
        events = await store.read_events(thread_id)
        replay = await store.replay_events(thread_id)
        last = events[-1].sequence if events else 0
        tails = {metadata.last_sequence, last, replay[-1].sequence if replay else last}
        if len(tails) == 1 or time.monotonic() > deadline:
            return metadata, events, replay
        await anyio.sleep(0.1)


async def verify(
    stats: KindStats, spec: StoreSpec, mode: str, states: dict[str, ThreadState]
) -> None:
    """Open the store afresh, read every trial thread back and run the mode's checks."""
    started = time.perf_counter()
    store: ThreadStore | None = None
    read: dict[str, tuple[ThreadMetadata, list[JournalEvent], list[JournalEvent]]] = {}
    journals: list[str] = []
    recovery_log = _RecoveryLog()
    logger = logging.getLogger("roder")
    level = logger.level
    logger.setLevel(logging.INFO)  # "a writer died" is logged at INFO
    logger.addHandler(recovery_log)
    try:
        store = await spec.factory().open()
        for thread_id in states:
            read[thread_id] = await settled_read(store, thread_id)
    except RoderError as exc:
        stats.problem(f"{stats.kind}: reopening after a kill failed: {exc!r}", corrupt=1)
        return
    finally:
        if store is not None:
            journal_path = getattr(store, "journal_path", None)
            if journal_path is not None:
                journals = [str(journal_path(thread_id)) for thread_id in states]
            await store.aclose()
        logger.removeHandler(recovery_log)
        logger.setLevel(level)
        for what, count in recovery_log.counts.items():
            stats.notes[what] = stats.notes.get(what, 0) + count
    stats.recovery_ms.append((time.perf_counter() - started) * 1000)
    if journals:
        stats.raw_ms.append(await anyio.to_thread.run_sync(raw_read_ms, journals))
    for thread_id, (metadata, events, replay) in read.items():
        state = states[thread_id]
        for checker in CHECKERS[mode]:
            checker(stats, thread_id, state, metadata, events)
        check_journal(stats, thread_id, state, metadata, events, replay)


async def create_threads(spec: StoreSpec, count: int) -> dict[str, ThreadState]:
    """Create ``count`` fresh threads on the store; return their (empty) states."""
    store = await spec.factory().open()
    try:
        states: dict[str, ThreadState] = {}
        for _ in range(count):
            thread_id = "torture-" + uuid.uuid4().hex[:12]
            now = int(time.time() * 1000)
            await store.create_thread(ThreadMetadata(thread_id, now, now))
            states[thread_id] = ThreadState()
        return states
    finally:
        await store.aclose()


class _RecoveryLog(logging.Handler):
    """Counts what a store's recovery reported while reopening (torn tails cut, ...)."""

    KINDS = (
        ("cut a torn", "torn tails cut on reopen"),
        ("missing newline", "newlines restored on reopen"),
        ("died", "dead writers caught up"),
    )

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        for needle, label in self.KINDS:
            if needle in message:
                self.counts[label] = self.counts.get(label, 0) + 1


def raw_read_ms(paths: Sequence[str]) -> float:
    """Return the ms it takes to read files and parse each line with orjson (the baseline)."""
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb") as file:
            for line in file.read().splitlines():
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError:
                    pass  # a torn tail: the raw baseline does not judge it
    return (time.perf_counter() - started) * 1000


def _run_child_and_kill(
    ctx: BaseContext,
    job: ChildJob,
    rng: random.Random,
    max_delay: float,
    early_kill: float = EARLY_KILL_FRACTION,
) -> tuple[bool, float]:
    """Start a child, kill it with SIGKILL at a random moment; return (was ready, delay)."""
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=child_entry, args=(job, send), daemon=True)  # type: ignore[attr-defined]
    process.start()
    send.close()
    ready = False
    try:
        if rng.random() < early_kill:
            delay = rng.uniform(0, 0.03)
            time.sleep(delay)
        else:
            if not receive.poll(60):
                raise RuntimeError(f"child for {job.spec.name} never became ready")
            receive.recv()
            ready = True
            delay = rng.uniform(0, max_delay)
            time.sleep(delay)
        if process.exitcode is not None:
            raise RuntimeError(
                f"child for {job.spec.name} ({job.mode}) exited by itself with "
                f"{process.exitcode}; run it alone to see its error"
            )
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
            process.join()
    return ready, delay


async def run_crash_trials(
    mode: str,
    spec: StoreSpec,
    trials: int,
    workdir: Path,
    *,
    seed: int = 0,
    max_delay: float = 0.1,
    ctx: BaseContext | None = None,
    backends: Sequence[str] = ("asyncio", "trio"),
) -> KindStats:
    """Run ``trials`` kill trials of ``mode`` against ``spec``; return the counts."""
    ctx = ctx or mp_context()
    stats = KindStats(f"{mode} / {spec.name}")
    rng = random.Random(seed)
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    states: dict[str, ThreadState] = {}
    for number in range(trials):
        if number % ROTATE_EVERY == 0:
            states = await create_threads(spec, THREADS_PER_CHILD)
        ack_path = workdir / f"acks-{mode}-{spec.name}-{number}.jsonl"
        job = ChildJob(
            mode=mode,
            spec=spec,
            thread_ids=tuple(states),
            ack_path=str(ack_path),
            seed=seed * 100_000 + number,
            backend=backends[number % len(backends)],
        )
        await anyio.to_thread.run_sync(_run_child_and_kill, ctx, job, rng, max_delay)
        stats.trials += 1
        stats.faults += 1
        acks = read_acks(ack_path)
        ack_path.unlink(missing_ok=True)
        logs = [a["log"] for a in acks if "log" in a]
        acks = [a for a in acks if "log" not in a]
        if logs:
            stats.notes["recovery warnings"] = stats.notes.get("recovery warnings", 0) + len(logs)
        stats.acked += record_acks(mode, acks, states)
        for key, label in (("boundary", "boundaries committed"), ("discarded", "discarded")):
            found = sum(1 for a in acks if a.get(key))
            if found:
                stats.notes[label] = stats.notes.get(label, 0) + found
        await verify(stats, spec, mode, states)
    return stats
