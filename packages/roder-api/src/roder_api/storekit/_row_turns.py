"""Transcript items straight from event rows: the relational stores' ``read_snapshot`` pass.

:func:`turns_from_rows` is what ``TurnFold().add_events(journal_events(rows))`` returns,
in one pass and without a ``JournalEvent`` or an ``ItemCompleted`` per row: an item's
event is decoded straight to its item (the JSONL store's ``read_turns`` does the same over
its lines). Every other event is decoded too, so a row that does not decode is damage here
as in a read of events. Profiled on a 50,000-item SQLite thread (thread CPU, medians): the
chunked ``read_sync`` + ``TurnFold`` path cost ~154 ms, this pass ~105 ms; reading only
the event column (no sequence, no time) saved ~3 ms of that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from roder_api._thread_contract import Turn
from roder_api.codec import EXACT_MARK, event_decoders, from_dict, gc_paused, loads_json
from roder_api.events import ItemCompleted

_MARKS = (EXACT_MARK[0], EXACT_MARK.decode())
"""The first byte (or character) of an event the codec wrote with the standard library."""


class RowsNotWhole(Exception):
    """The rows are not events 1..last that all decode: the caller finds out where (the
    damage error names the sequence) by reading the events the general way."""


def turns_from_rows(rows: Iterable[tuple[Any]], last: int) -> tuple[Turn, ...]:
    """Return the transcript items of one-column ``(event JSON,)`` rows, grouped by turn.

    ``rows`` must be a thread's events 1..``last`` in sequence order, from a query that
    cannot return a sequence twice or outside 1..``last`` (then ``last`` rows are exactly
    those events). Raise :class:`RowsNotWhole` when a row does not decode or the count is
    not ``last``. The grouping is ``TurnFold.add`` written inline (a call per item costs
    ~7 %).
    """
    turns: list[Turn] = []
    items: list[Any] = []
    turn_id: Any = None
    parse, exact, decoders, decode = orjson.loads, loads_json, event_decoders(), from_dict
    marks = _MARKS
    count = 0
    with gc_paused():
        try:
            for (raw,) in rows:
                count += 1
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
                if owner != turn_id:
                    if items:
                        turns.append(Turn(turn_id, tuple(items)))
                        items = []
                    turn_id = owner
                items.append(item)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise RowsNotWhole(f"row {count} does not decode: {exc}") from None
    if count != last:
        raise RowsNotWhole(f"{count} rows for sequences 1..{last}")
    if items:
        turns.append(Turn(turn_id, tuple(items)))
    return tuple(turns)


__all__ = ["RowsNotWhole", "turns_from_rows"]
