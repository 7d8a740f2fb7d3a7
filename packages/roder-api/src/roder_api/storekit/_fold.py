"""The fold of a journal into metadata and turns, and the one rule for where replay starts.

Replay starts at the last boundary event (``roder_api.events.is_boundary_event``): a
compaction boundary, local or native. :func:`replay_start` finds it in a list of events;
stores that remember it advance a *boundary sequence* with :func:`last_boundary_sequence`
on every append and read from :func:`replay_after` on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from roder_api._store_waits import TURN_EVENT_TYPES, open_turns_after, turn_change
from roder_api._thread_contract import ThreadMetadata, Turn, TurnFold, replay_start
from roder_api.events import ItemCompleted, JournalEvent, UsageUpdated, is_boundary_event


def fold_metadata(metadata: ThreadMetadata, entries: Iterable[JournalEvent]) -> ThreadMetadata:
    """Return ``metadata`` advanced over journal ``entries`` (usage, counts, times, open
    turns)."""
    usage = metadata.usage
    item_count = metadata.item_count
    last_sequence = metadata.last_sequence
    updated = metadata.updated_at_ms
    opened = metadata.open_turns
    turn_events = TURN_EVENT_TYPES
    changed = False
    for entry in entries:
        changed = True
        event = entry.event
        if isinstance(event, UsageUpdated):
            usage = usage + event.usage
        elif isinstance(event, ItemCompleted):
            item_count += 1
        elif type(event) in turn_events:
            opened = turn_change(opened, event)
        last_sequence = entry.sequence
        if entry.recorded_at_ms > updated:
            updated = entry.recorded_at_ms
    if not changed:
        return metadata
    return replace(
        metadata,
        usage=usage,
        item_count=item_count,
        last_sequence=last_sequence,
        updated_at_ms=updated,
        open_turns=opened,
    )


def turns_from_events(entries: Iterable[JournalEvent]) -> tuple[Turn, ...]:
    """Return the transcript items of ``entries`` grouped into turns, in journal order."""
    fold = TurnFold()
    fold.add_events(entries)
    return fold.turns()


def last_boundary_sequence(entries: Sequence[JournalEvent], previous: int) -> int:
    """Return the sequence of the last boundary event in ``entries``, else ``previous``.

    Stores that remember where replay starts advance it with this on every append
    (0: the thread has no boundary).
    """
    for entry in reversed(entries):
        if is_boundary_event(entry.event):
            return entry.sequence
    return previous


def replay_after(boundary_sequence: int) -> int:
    """Return the ``after`` of the read that replays a thread whose last boundary is given.

    Replay includes the boundary itself; ``boundary_sequence`` 0 (none) replays everything.
    """
    return max(0, boundary_sequence - 1)


__all__ = [
    "fold_metadata",
    "open_turns_after",
    "last_boundary_sequence",
    "replay_after",
    "replay_start",
    "turns_from_events",
]
