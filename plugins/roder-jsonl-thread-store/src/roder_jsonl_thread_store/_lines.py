"""The read loop over a journal's lines for events, and what every read pass reports.

It (and the snapshot pass, ``_turns``) checks every line's frame and checksum (a line cut
short or with a damaged checksum field fails the hex parse or the checksum; fsck also
compares the frame byte for byte) and stops at the state's size (what is known to be
complete). A line that fails is damage: :func:`damaged` remembers it for the store and
returns the ``StoreCorruptedError`` to raise. The loop runs once per line of a thread, so
what it calls is bound to locals first, and the frame check is written out rather than
shared: a generator or a function call per line measured 7 % slower on a 50,000-line load
(152 -> 163 ms of thread CPU).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import orjson

from roder_api.codec import EXACT_MARK, event_decoders, from_dict, journal_event_builder, loads_json
from roder_api.errors import StoreCorruptedError, StoreError
from roder_api.events import JournalEvent
from roder_jsonl_thread_store._core import StoreCore
from roder_jsonl_thread_store._format import (
    CRC_END,
    CRC_START,
    FORMAT_VERSION,
    LINE_END,
    RECORD_START,
)
from roder_jsonl_thread_store._format import (
    crc32 as fast_crc32,
)
from roder_jsonl_thread_store._journal import JournalState

_TAIL_LEN = len(LINE_END)
_EXACT = EXACT_MARK[0]
"""The first byte of a record the codec wrote with the standard library (read with it)."""


def newer_format(path: Path | str, version: object) -> StoreError:
    """Return the error for a record of a format newer than this code reads."""
    return StoreError(
        f"journal {path} holds format version {version!r} from a newer Roder (this one "
        f"reads up to {FORMAT_VERSION}); upgrade roder"
    )


def out_of_order(seq: object, expected: int) -> str:
    """Return why an events line whose first sequence is not the one expected is damage."""
    return (
        f"sequence {seq} where sequence {expected} was expected: lines are out of order, "
        "repeated or missing"
    )


def cut_short(expected: int, state: JournalState) -> ValueError:
    """Return why a journal whose lines end before the last sequence known is damage."""
    return ValueError(
        f"the lines end at sequence {expected - 1}, the journal's last known sequence is "
        f"{state.metadata.last_sequence}: lines are missing"
    )


def damaged(
    core: StoreCore,
    thread_id: str,
    path: Path | str,
    state: JournalState,
    file: BinaryIO,
    where: tuple[int, int | None],
    exc: Exception,
) -> StoreCorruptedError:
    """Remember a damaged journal (until it changes) and return the error to raise.

    ``where`` is the line number (None when the read began mid-file) and the byte offset.
    """
    number, offset = where[1], where[0]
    place = f"line {number}" if number is not None else f"byte {offset}"
    error = StoreCorruptedError(
        f"journal {path} is damaged at {place} ({exc}); nothing was changed; run "
        "`roder fsck --repair` to move the damaged part to a quarantine file",
        thread_id=thread_id,
        path=str(path),
        line=number,
    )
    with core.guard(thread_id):
        core.states.pop(thread_id, None)
        core.damaged[thread_id] = (state.inode, os.fstat(file.fileno()).st_size, error)
    return error


def read_events(
    core: StoreCore,
    file: BinaryIO,
    path: Path | str,
    thread_id: str,
    state: JournalState,
    window: tuple[int, int, int | None, int | None],
) -> list[JournalEvent]:
    """Return the events with ``after < sequence < before``, at most ``limit``.

    ``window`` is ``(offset, after, before, limit)``: the line offset to start reading at
    (at or before the first wanted event) and the bounds (None: none).
    """
    offset, after, before, limit = window
    out: list[JournalEvent] = []
    append = out.append
    parse, exact, crc32, decoders = orjson.loads, loads_json, fast_crc32, event_decoders()
    decode, make = from_dict, journal_event_builder()
    end = state.size
    stop = before if before is not None else state.metadata.last_sequence + 1
    room = limit if limit is not None else state.metadata.last_sequence + 1
    position = offset
    number = 0
    # The sequence the next events line must start at (0: the first line read mid-file,
    # which must hold or precede ``after + 1``): the index row only says where the journal
    # ends, so what is read is checked, and an edit that kept the size is damage too.
    expected = 1 if offset == 0 else 0
    file.seek(offset)
    for raw in file:
        position += len(raw)
        number += 1
        if position > end:
            break
        try:
            body = raw[RECORD_START:-_TAIL_LEN]
            if crc32(body) != int(raw[CRC_START:CRC_END], 16) or raw[-_TAIL_LEN:] != LINE_END:
                raise ValueError("bad framing or checksum mismatch")
            record = parse(body) if body[0] != _EXACT else exact(body)
            if record["v"] > FORMAT_VERSION:
                raise newer_format(path, record["v"])
            if record["k"] != "events":
                continue
            seq = record["seq"]
            events = record["events"]
            count = len(events)
            if seq != expected and (expected or not 0 < seq <= after + 1):
                raise ValueError(out_of_order(seq, expected or after + 1))
            expected = seq + count
            if count == 1 and after < seq < stop:
                # The common case: a line of one event, and it is wanted (room >= 1).
                event = events[0]
                try:
                    decoded = decoders[event["type"]](event)
                except (KeyError, TypeError):
                    decoded = decode(event)  # the codec's own error for a bad event
                append(make(seq, record["t"], decoded))
                room -= 1
                if room == 0:
                    return out
                continue
            if seq > after and seq + count <= stop and count <= room:
                # The whole line is wanted.
                t = record["t"]
                for index, event in enumerate(events):
                    try:
                        decoded = decoders[event["type"]](event)
                    except (KeyError, TypeError):
                        decoded = decode(event)  # the codec's own error for a bad event
                    append(make(seq + index, t, decoded))
                room -= count
                if room == 0:
                    return out
                continue
            if seq + count <= after + 1:
                continue
            if seq >= stop:
                return out
            t = record["t"]
            for index, event in enumerate(events):
                sequence = seq + index
                if sequence <= after:
                    continue
                if sequence >= stop:
                    return out
                append(make(sequence, t, decode(event)))
                room -= 1
                if room == 0:
                    return out
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            where = (position - len(raw), number if offset == 0 else None)
            raise damaged(core, thread_id, path, state, file, where, exc) from None
    if expected - 1 != state.metadata.last_sequence:
        where = (min(position, end), number + 1 if offset == 0 else None)
        raise damaged(core, thread_id, path, state, file, where, cut_short(expected, state))
    return out
