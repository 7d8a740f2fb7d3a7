"""What a crash trial's threads must show: the state the parent learned from the
children's acknowledgements (:class:`ThreadState`), the checks common to every mode, and
the checks each mode adds (:func:`register_checker`; ``sessions`` and ``inturn`` add theirs
when imported). Used by ``crash`` (the trials) and ``faults``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ItemCompleted,
    JournalEvent,
    TurnComplete,
    UsageUpdated,
)
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import AssistantMessage, UserMessage, is_compaction_boundary

from .stats import KindStats


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
