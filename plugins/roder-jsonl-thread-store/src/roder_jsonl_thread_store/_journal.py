"""Scanning a journal: checking every line and folding it into the thread's state.

A scan reads a journal a line at a time from where the known state ends, checks each line's
framing, checksum, format version and sequence numbers, folds the good ones into the
metadata (usage, counts, title, times) and remembers where the last compaction boundary
starts. It stops folding at the first problem and describes it as a :class:`Damage`.
The writer folds what it appends into the same state with :func:`advance` (and a create's
first line with :func:`header_metadata`), so a commit never rescans the journal.

Only a torn tail is a crash mid-write: a last line without its newline (every commit is one
``write`` that ends with the newline, and is acknowledged only after it). Readers skip it;
the next write to the thread moves it to a quarantine file. Everything else is damage that
only ``roder fsck --repair`` may touch: a complete line that fails its check (the last one
included), a bad line followed by valid ones, a sequence gap, a bad first line, a newer
format.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO

from roder_api.codec import from_dict
from roder_api.errors import StoreError
from roder_api.events import ItemCompleted, JournalEvent, UsageUpdated, is_boundary_event
from roder_api.inference import TokenUsage
from roder_api.storekit import TURN_EVENT_TAGS, TURN_EVENT_TYPES, turn_change
from roder_api.threads import ThreadMetadata
from roder_api.transcript import is_compaction_boundary
from roder_jsonl_thread_store._format import FORMAT_VERSION, NEWLINE, BadLine, line_crc, parse_line

TORN_TAIL = "torn_tail"
DAMAGED_LINE = "damaged_line"
MID_FILE = "mid_file"
SEQUENCE = "sequence"
HEADER = "header"
NEWER_VERSION = "newer_version"
TRUNCATED = "truncated"

AUTOMATIC = frozenset({TORN_TAIL})
"""Damage kinds a writer repairs on its own (under the writer lock): a crash mid-write."""


TAIL_LINES = 16
"""How many of the last events lines a journal's state remembers the start of: a turn's
lines (its start, its first text, merged text, its end) are a handful."""


@dataclass(slots=True)
class JournalState:
    """What is known of a journal up to ``size`` bytes (``lines`` complete lines)."""

    inode: int
    size: int
    lines: int
    head_crc: int
    metadata: ThreadMetadata
    boundary_offset: int
    boundary_sequence: int
    tail: tuple[tuple[int, int], ...] = ()
    """Where the last :data:`TAIL_LINES` events lines this store wrote start, and the first
    sequence in each, oldest first (empty: not known, as after a scan)."""

    def describes(self, st: os.stat_result) -> bool:
        """Return True when ``st`` (the journal's ``stat``) shows the file this state left:
        the same inode and size."""
        return self.inode == st.st_ino and self.size == st.st_size


@dataclass(frozen=True, slots=True)
class Damage:
    """The first problem a scan met: where (byte offset, 1-based line) and what."""

    offset: int
    line: int
    kind: str
    reason: str
    version: int | None = None

    @property
    def automatic(self) -> bool:
        """Return True when the next write repairs this (a crash mid-write)."""
        return self.kind in AUTOMATIC


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The state up to the last good line, and the first damage after it (if any)."""

    state: JournalState | None
    damage: Damage | None
    file_size: int


def raw_is_boundary(event: Mapping[str, Any]) -> bool:
    """Return True when an event dict completes a compaction boundary item."""
    if event.get("type") != "item_completed":
        return False
    item = event.get("item")
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    if kind == "context_compaction":
        return True
    if kind != "provider_metadata":
        return False
    try:
        return is_compaction_boundary(from_dict(item))
    except ValueError:
        return False


class _Fold:
    """Accumulates the metadata of a journal record by record."""

    def __init__(self, state: JournalState | None, thread_id: str | None) -> None:
        self.thread_id = thread_id
        self.meta = state.metadata if state is not None else None
        meta = self.meta
        self.usage = meta.usage if meta else TokenUsage()
        self.items = meta.item_count if meta else 0
        self.last_seq = meta.last_sequence if meta else 0
        self.updated = meta.updated_at_ms if meta else 0
        self.title = meta.title if meta else None
        self.extra: Mapping[str, Any] = meta.extra if meta else {}
        self.opened: tuple[str, ...] = meta.open_turns if meta else ()
        self.boundary_offset = state.boundary_offset if state else 0
        self.boundary_sequence = state.boundary_sequence if state else 0
        self.head_crc = state.head_crc if state else 0

    def metadata(self) -> ThreadMetadata | None:
        if self.meta is None:
            return None
        return replace(
            self.meta,
            title=self.title,
            extra=self.extra,
            updated_at_ms=self.updated,
            usage=self.usage,
            item_count=self.items,
            last_sequence=self.last_seq,
            open_turns=self.opened,
        )

    def add(self, record: dict[str, Any], offset: int, number: int, raw: bytes) -> str | None:
        """Fold one record; return the kind of damage it is, or None when it is good."""
        kind = record.get("k")
        if self.meta is None:
            if kind != "create" or not isinstance(record.get("meta"), Mapping):
                return HEADER
            try:
                base = from_dict(record["meta"])
            except ValueError:
                return HEADER
            if not isinstance(base, ThreadMetadata):
                return HEADER
            if self.thread_id is not None and base.thread_id != self.thread_id:
                return HEADER
            self.meta = replace(
                base, usage=TokenUsage(), item_count=0, last_sequence=0, open_turns=()
            )
            self.opened = ()
            self.updated = base.updated_at_ms
            self.title, self.extra = base.title, base.extra
            self.head_crc = line_crc(raw)
            return None
        if kind == "events":
            seq = record.get("seq")
            events = record.get("events")
            if seq != self.last_seq + 1 or not isinstance(events, list) or not events:
                return SEQUENCE
            for index, event in enumerate(events):
                etype = event.get("type") if isinstance(event, dict) else None
                if etype == "usage_updated":
                    try:
                        self.usage = self.usage + from_dict(event["usage"])
                    except (KeyError, ValueError, TypeError):
                        return SEQUENCE
                elif etype == "item_completed":
                    self.items += 1
                    if raw_is_boundary(event):
                        self.boundary_offset = offset
                        self.boundary_sequence = seq + index
                elif etype in TURN_EVENT_TAGS:
                    try:
                        self.opened = turn_change(self.opened, from_dict(event))
                    except (ValueError, TypeError):
                        return SEQUENCE
            self.last_seq = seq + len(events) - 1
            t = record.get("t")
            if isinstance(t, int) and t > self.updated:
                self.updated = t
        elif kind == "meta":
            if "title" in record:
                self.title = record["title"]
            if "extra" in record:
                self.extra = record["extra"]
            t = record.get("t")
            if isinstance(t, int) and t > self.updated:
                self.updated = t
        # Other kinds are extensions of a newer minor version: kept, skipped.
        return None


_REASONS = {
    TORN_TAIL: "the last line has no newline (a write that never completed)",
    HEADER: "the first line is not a valid create record of this thread",
    SEQUENCE: "the sequence numbers do not continue the journal",
}


def lost_lines(
    state: JournalState, row_lines: int, row_head_crc: int, row_last: int
) -> Damage | None:
    """Return the damage of a journal shorter than its index row says, else None.

    The row records how many complete lines the journal had and its last sequence; a
    journal of the same first line that now ends before them lost lines (cut at a line
    boundary, or an older copy put back): damage, or the next append would write a lost
    sequence number a second time.
    """
    if row_head_crc != state.head_crc or (
        row_lines <= state.lines and row_last <= state.metadata.last_sequence
    ):
        return None
    return Damage(
        state.size,
        state.lines + 1,
        TRUNCATED,
        f"the journal ends at sequence {state.metadata.last_sequence} after {state.lines} "
        f"lines, but its index row knows sequence {row_last} and {row_lines} lines: lines "
        "are missing (the journal was cut, or an older copy put in its place)",
    )


def last_line_damage(file: BinaryIO, state: JournalState) -> Damage | None:
    """Return damage when the journal's last events line does not end at the known sequence.

    The check of a state taken from the index row without reading the journal (sizes
    match): one read near the end. Lines swapped or repeated at the end (the size
    unchanged) are found here before a write continues the journal.
    """
    if state.metadata.last_sequence == 0:
        return None
    end, number, window = state.size, state.lines, 4096
    while True:
        start = max(0, end - window)
        file.seek(start)
        data = file.read(end - start)
        cut = data.rfind(NEWLINE, 0, len(data) - 1)
        if cut >= 0 or start == 0:
            line = data[cut + 1 :]
            offset = start + cut + 1
            try:
                record = parse_line(line[:-1])
            except BadLine as exc:
                return Damage(offset, number, DAMAGED_LINE, str(exc))
            if record.get("k") == "events":
                events = record.get("events")
                seq = record.get("seq")
                count = len(events) if isinstance(events, list) else 0
                if not isinstance(seq, int) or seq + count - 1 != state.metadata.last_sequence:
                    return Damage(
                        offset,
                        number,
                        SEQUENCE,
                        f"the last events line ends at sequence "
                        f"{seq + count - 1 if isinstance(seq, int) else seq!r}, but the "
                        f"journal's index row says {state.metadata.last_sequence}",
                    )
                return None
            if offset == 0:
                return Damage(0, 1, SEQUENCE, "no events line, but the index row knows events")
            end, number, window = offset, number - 1, 4096  # a meta line: the one before it
        else:
            window *= 2


def scan(
    file: BinaryIO,
    inode: int,
    start: JournalState | None,
    *,
    thread_id: str | None = None,
    full_check: bool = False,
) -> ScanResult:
    """Scan ``file`` from where ``start`` ends (the beginning when None).

    Streams the file a line at a time. After the first bad line it only looks for a valid
    line further on (which makes the damage mid-file); with ``full_check`` it goes on after
    a sequence problem too (for fsck, which reports but never raises). ``file_size`` of the
    result is where the scan stopped reading.
    """
    fold = _Fold(start, thread_id)
    position = start.size if start is not None else 0
    number = start.lines if start is not None else 0
    good_end, good_lines = position, number
    damage: Damage | None = None
    file.seek(position)
    for raw in file:
        offset = position
        position += len(raw)
        number += 1
        terminated = raw[-1:] == NEWLINE
        body = raw[:-1] if terminated else raw
        if not terminated:
            # Only the last line can lack its newline: the write of a commit never finished.
            if damage is None:
                damage = Damage(offset, number, TORN_TAIL, _REASONS[TORN_TAIL])
            break
        try:
            record = parse_line(body)
        except BadLine as exc:
            if damage is None:
                damage = Damage(offset, number, DAMAGED_LINE, str(exc))
            continue
        if damage is not None:
            if damage.kind == DAMAGED_LINE:
                damage = replace(damage, kind=MID_FILE)
            break
        version = record.get("v")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            damage = Damage(
                offset,
                number,
                NEWER_VERSION,
                f"format version {version!r} is newer than {FORMAT_VERSION}",
                version if isinstance(version, int) else None,
            )
            break
        problem = fold.add(record, offset, number, body)
        if problem is not None:
            damage = Damage(offset, number, problem, _REASONS[problem])
            if not full_check:
                break
            continue
        good_end, good_lines = position, number
    metadata = fold.metadata()
    state = None
    if metadata is not None:
        state = JournalState(
            inode=inode,
            size=good_end,
            lines=good_lines,
            head_crc=fold.head_crc,
            metadata=metadata,
            boundary_offset=fold.boundary_offset,
            boundary_sequence=fold.boundary_sequence,
        )
    return ScanResult(state, damage, position)


def advance(state: JournalState, line: bytes, entries: Sequence[JournalEvent]) -> None:
    """Fold one appended events line into ``state`` (in place)."""
    offset = state.size
    meta = state.metadata
    usage = meta.usage
    items = meta.item_count
    updated = meta.updated_at_ms
    opened = meta.open_turns
    for entry in entries:
        event = entry.event
        if type(event) in TURN_EVENT_TYPES:
            opened = turn_change(opened, event)
        elif isinstance(event, UsageUpdated):
            usage = usage + event.usage
        elif isinstance(event, ItemCompleted):
            items += 1
            if is_boundary_event(event):
                state.boundary_offset = offset
                state.boundary_sequence = entry.sequence
        if entry.recorded_at_ms > updated:
            updated = entry.recorded_at_ms
    if entries:
        state.tail = (*state.tail[1 - TAIL_LINES :], (offset, entries[0].sequence))
        # What fold_metadata computes, built directly: dataclasses.replace costs more than
        # the rest of a commit's bookkeeping.
        state.metadata = ThreadMetadata(
            thread_id=meta.thread_id,
            created_at_ms=meta.created_at_ms,
            updated_at_ms=updated,
            title=meta.title,
            usage=usage,
            item_count=items,
            last_sequence=entries[-1].sequence,
            extra=meta.extra,
            open_turns=opened,
            unknown_fields=meta.unknown_fields,
        )
    state.size += len(line)
    state.lines += 1


def copy_state(state: JournalState) -> JournalState:
    """Return a copy of ``state`` (a commit works on a copy until its write lands)."""
    return JournalState(
        state.inode,
        state.size,
        state.lines,
        state.head_crc,
        state.metadata,
        state.boundary_offset,
        state.boundary_sequence,
        state.tail,
    )


def header_metadata(line: bytes) -> ThreadMetadata:
    """Return the metadata a scan folds from a journal's create line alone."""
    base = from_dict(parse_line(line[:-1])["meta"])
    if not isinstance(base, ThreadMetadata):  # pragma: no cover - we encoded it just now
        raise StoreError("a create record that does not hold thread metadata")
    return replace(base, usage=TokenUsage(), item_count=0, last_sequence=0, open_turns=())
