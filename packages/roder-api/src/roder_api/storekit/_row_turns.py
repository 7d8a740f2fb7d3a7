"""Transcript items straight from event rows: the relational stores' ``read_snapshot`` pass.

:func:`turns_from_rows` is what ``TurnFold().add_events(journal_events(rows))`` returns,
in one pass and without a ``JournalEvent`` or an ``ItemCompleted`` per row: an item's
event is decoded straight to its item (the JSONL store's ``read_turns`` does the same over
its lines). Every other event is decoded too, so a row that does not decode is damage here
as in a read of events. Profiled on a 50,000-item SQLite thread: the chunked
``read_sync`` + ``TurnFold`` path cost ~150 ms of CPU, most of it per-row objects that
were dropped right after the fold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from roder_api.codec import (
    EXACT_MARK,
    event_decoders,
    from_dict,
    gc_paused,
    journal_events,
    loads_json,
)
from roder_api.errors import StoreCorruptedError
from roder_api.events import ItemCompleted
from roder_api.threads import Turn

_MARKS = (EXACT_MARK[0], EXACT_MARK.decode())
"""The first byte (or character) of an event the codec wrote with the standard library."""


def _damaged(thread_id: str, sequence: Any, raw: Any, exc: Exception) -> Exception:
    """Return the codec's own error for a row that does not decode (``exc`` if it decodes)."""
    try:
        journal_events([(sequence, 0, raw)], thread_id=thread_id)
    except StoreCorruptedError as error:
        return error
    return exc  # pragma: no cover - it decodes alone: the fast path's own error stands


def _gap(thread_id: str, expected: int, last: int) -> StoreCorruptedError:
    return StoreCorruptedError(
        f"thread {thread_id!r} is damaged: the event at sequence {expected} is missing (a "
        f"read of sequences 1..{last}); nothing was changed",
        thread_id=thread_id,
        sequence=expected,
    )


def turns_from_rows(thread_id: str, rows: Iterable[tuple[Any, Any]], last: int) -> tuple[Turn, ...]:
    """Return the transcript items of ``(sequence, event JSON)`` rows, grouped by turn.

    ``rows`` must be the thread's events 1..``last`` in order; a missing, extra or
    undecodable row raises ``StoreCorruptedError`` naming the thread and the sequence. The
    grouping is ``TurnFold.add`` written inline (a call per item costs ~7 %).
    """
    turns: list[Turn] = []
    items: list[Any] = []
    turn_id: Any = None
    parse, exact, decoders, decode = orjson.loads, loads_json, event_decoders(), from_dict
    marks = _MARKS
    expected = 1
    with gc_paused():
        for seq, raw in rows:
            if seq != expected:
                raise _gap(thread_id, expected, last)
            expected += 1
            try:
                data = parse(raw) if raw and raw[0] not in marks else exact(raw)
                if data["type"] == "item_completed" and len(data) == 3:
                    # ItemCompleted's own decoder, without building the event.
                    item = data["item"]
                    try:
                        item = decoders[item["type"]](item)
                    except (KeyError, TypeError):
                        item = decode(data).item  # the codec's own error or its general path
                    owner = data["turn_id"]
                else:
                    try:
                        event = decoders[data["type"]](data)
                    except (KeyError, TypeError):
                        event = decode(data)  # the codec's own error for a bad event
                    if not isinstance(event, ItemCompleted):
                        continue
                    item, owner = event.item, event.turn_id
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise _damaged(thread_id, seq, raw, exc) from None
            if owner != turn_id:
                if items:
                    turns.append(Turn(turn_id, tuple(items)))
                    items = []
                turn_id = owner
            items.append(item)
    if expected - 1 != last:
        raise _gap(thread_id, expected, last)
    if items:
        turns.append(Turn(turn_id, tuple(items)))
    return tuple(turns)


__all__ = ["turns_from_rows"]
