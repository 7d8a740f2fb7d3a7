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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson

from roder_api.errors import RoderError
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ItemCompleted,
    JournalEvent,
    TurnComplete,
    UsageUpdated,
)
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata, ThreadStore
from roder_api.transcript import AssistantMessage, UserMessage, is_compaction_boundary

from .child import ChildJob, child_entry
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


@dataclass
class ThreadState:
    """What the parent knows of one trial thread across kills."""

    acked: dict[str, tuple[int, int]] = field(default_factory=dict)  # batch -> (seq, size)
    seen: dict[str, int] = field(default_factory=dict)  # batch -> seq, once visible
    usage: TokenUsage = field(default_factory=TokenUsage)
    acked_turn_types: dict[str, list[str]] = field(default_factory=dict)
    acked_sequences: dict[int, str] = field(default_factory=dict)  # seq -> event type
    acked_boundaries: set[int] = field(default_factory=set)
    seen_events: list[JournalEvent] = field(default_factory=list)


Checker = Callable[[KindStats, str, ThreadState, ThreadMetadata, list[JournalEvent]], None]


def read_acks(path: Path) -> list[dict[str, Any]]:
    """Return the child's acknowledgements: its complete lines.

    Each ack is one ``os.write``, but a SIGKILL can still land inside that write and leave
    part of a line; the child never saw that write return, so it acknowledged nothing.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1]
    return [orjson.loads(line) for line in complete.splitlines() if line]


# --- the checks common to every mode -----------------------------------------------------------


def check_journal(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
    replay: list[JournalEvent],
) -> None:
    """Check sequences, metadata, usage, replay start and that nothing visible vanished."""
    where = f"{stats.kind} thread {thread_id}"
    sequences = [e.sequence for e in events]
    if sequences != list(range(1, len(events) + 1)):
        gaps = [s for a, s in zip([0, *sequences], sequences, strict=False) if s != a + 1][:3]
        stats.problem(f"{where}: sequences not consecutive (first breaks at {gaps})", corrupt=1)
    if metadata.last_sequence != len(events):
        stats.problem(
            f"{where}: metadata last_sequence {metadata.last_sequence} but {len(events)} events",
            corrupt=1,
        )
    usage = TokenUsage()
    items = 0
    boundary_index = None
    for index, entry in enumerate(events):
        if isinstance(entry.event, UsageUpdated):
            usage = usage + entry.event.usage
        elif isinstance(entry.event, ItemCompleted):
            items += 1
            if is_compaction_boundary(entry.event.item):
                boundary_index = index
    if metadata.usage != usage:
        stats.problem(f"{where}: metadata usage {metadata.usage} != journal {usage}", corrupt=1)
    if metadata.item_count != items:
        stats.problem(f"{where}: item_count {metadata.item_count} != {items}", corrupt=1)
    if usage.total_tokens < state.usage.total_tokens:
        stats.problem(
            f"{where}: billed usage went down from {state.usage.total_tokens} to "
            f"{usage.total_tokens}",
            corrupt=1,
        )
    state.usage = usage
    expected_replay = events[boundary_index:] if boundary_index is not None else events
    if replay != expected_replay:
        start = replay[0].sequence if replay else None
        want = expected_replay[0].sequence if expected_replay else None
        stats.problem(
            f"{where}: replay starts at {start} ({len(replay)} events), the last boundary "
            f"says {want} ({len(expected_replay)} events)",
            corrupt=1,
        )
    # What a reader saw once must stay: a later recovery may not cut committed records.
    previous = state.seen_events
    if events[: len(previous)] != previous:
        stats.problem(
            f"{where}: events visible after an earlier kill changed or vanished "
            f"({len(previous)} seen before, {len(events)} now)",
            lost=1,
        )
    state.seen_events = events


def check_batches(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
) -> None:
    """Check that batches are whole and every acknowledged batch is where it was acked."""
    where = f"{stats.kind} thread {thread_id}"
    present: dict[str, int] = {}
    index = 0
    while index < len(events):
        batch_id = getattr(events[index].event, "turn_id", None)
        run_end = index
        while run_end < len(events) and getattr(events[run_end].event, "turn_id", None) == batch_id:
            run_end += 1
        run = events[index:run_end]
        problem = _batch_problem(str(batch_id), run)
        if batch_id in present:
            problem = problem or "appears twice"
        if problem:
            stats.problem(f"{where}: batch {batch_id} at {run[0].sequence}: {problem}", corrupt=1)
        present[str(batch_id)] = run[0].sequence
        index = run_end
    for batch_id, (sequence, _size) in state.acked.items():
        if present.get(batch_id) != sequence:
            stats.problem(
                f"{where}: acknowledged batch {batch_id} (sequence {sequence}) is missing",
                lost=1,
            )


def _batch_problem(batch_id: str, run: Sequence[JournalEvent]) -> str | None:
    last = run[-1].event
    if not isinstance(last, UsageUpdated):
        return f"ends with {type(last).__name__}, not its usage (half a batch)"
    size = len(run)
    for position, entry in enumerate(run[:-1]):
        event = entry.event
        if not isinstance(event, ItemCompleted):
            return f"holds a {type(event).__name__}"
        item = event.item
        text = str(getattr(item, "text", None) or getattr(item, "summary", ""))
        parts = text.split("|", 3)
        if parts[:3] != [batch_id, str(position), str(size)]:
            return f"event {position} says {parts[:3]}, expected a whole batch of {size}"
    return None


def check_turns(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
) -> None:
    """Check turns: acknowledged events present in order, whole final batches, exact text."""
    where = f"{stats.kind} thread {thread_id}"
    by_turn: dict[str, list[JournalEvent]] = {}
    for entry in events:
        by_turn.setdefault(str(getattr(entry.event, "turn_id", None)), []).append(entry)
    for turn_id, acked in state.acked_turn_types.items():
        types = [type(e.event).__name__ for e in by_turn.get(turn_id, [])]
        # In journal order; not always a prefix: a turn a killed child left open is closed
        # (TurnAborted) by the next child, which delivers only that.
        if not _in_order(acked, types):
            stats.problem(
                f"{where}: turn {turn_id}: acknowledged {acked[len(types) :][:3] or acked[:3]} "
                f"not in the journal ({len(types)} of {len(acked)} events there)",
                lost=1,
            )
    for turn_id, entries in by_turn.items():
        users = _item_texts(entries, UserMessage)
        user = users[0] if users else None
        deltas = "".join(
            e.event.delta
            for e in entries
            if isinstance(e.event, AssistantContentDelta)
            and e.event.phase == ContentPhase.FINAL_ANSWER
        )
        answer = _item_texts(entries, AssistantMessage)
        complete = [e for e in entries if isinstance(e.event, TurnComplete)]
        expected = f"You said: {user}"
        if user is not None and not expected.startswith(deltas):
            stats.problem(f"{where}: turn {turn_id}: streamed text {deltas[:40]!r}…", corrupt=1)
        if bool(answer) != bool(complete):
            stats.problem(
                f"{where}: turn {turn_id}: half a final batch (answer {bool(answer)}, "
                f"complete {bool(complete)})",
                corrupt=1,
            )
        if answer and answer[0] != deltas:
            stats.problem(f"{where}: turn {turn_id}: answer differs from its deltas", corrupt=1)
    for sequence, type_name in state.acked_sequences.items():
        if sequence > len(events) or type(events[sequence - 1].event).__name__ != type_name:
            stats.problem(f"{where}: delivered event {sequence} ({type_name}) missing", lost=1)


def _in_order(wanted: Sequence[str], found: Sequence[str]) -> bool:
    """Return True when ``wanted`` occurs in ``found`` in the same order (a subsequence)."""
    remaining = iter(found)
    return all(any(item == seen for seen in remaining) for item in wanted)


def _item_texts(entries: Sequence[JournalEvent], kind: type) -> list[str]:
    """Return the texts of the completed items of ``kind`` (not those marked interrupted)."""
    texts = []
    for entry in entries:
        event = entry.event
        if isinstance(event, ItemCompleted) and isinstance(event.item, kind):
            if not getattr(event.item, "interrupted", False):
                texts.append(str(getattr(event.item, "text", "")))
    return texts


def record_acks(mode: str, acks: list[dict[str, Any]], states: dict[str, ThreadState]) -> int:
    """Fold a trial's acknowledgements into the thread states; return how many commits."""
    for ack in acks:
        state = states[ack["t"]]
        if "b" in ack:  # a raw batch
            state.acked[ack["b"]] = (ack["s"], ack["n"])
        elif "types" in ack:  # events handed to run_turn's emit
            if ack["turn"] is not None:
                state.acked_turn_types.setdefault(ack["turn"], []).extend(ack["types"])
        elif "s" in ack:  # an event delivered by a session, or a committed boundary
            state.acked_sequences[ack["s"]] = ack["type"]
            if ack.get("boundary"):
                state.acked_boundaries.add(ack["s"])
    return len(acks)


CHECKERS: dict[str, list[Checker]] = {
    "append": [check_batches],
    "turn": [check_turns],
    "session": [check_turns],
    "compact": [check_turns],
    "inturn": [check_turns],
}


def register_checker(mode: str, checker: Checker) -> None:
    """Add a check for a mode (the session and compaction modules add theirs)."""
    CHECKERS.setdefault(mode, []).append(checker)


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


# The session and compaction modes register their checks on import (after everything above).
from . import inturn as _inturn  # noqa: E402, F401
from . import sessions as _sessions  # noqa: E402, F401
