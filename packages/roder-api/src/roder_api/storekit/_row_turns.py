"""Transcript items straight from event rows: the relational stores' ``read_snapshot`` pass.

:func:`turns_from_rows` is what ``TurnFold().add_events(journal_events(rows))`` returns,
in one pass and without a ``JournalEvent`` or an ``ItemCompleted`` per row: an item's
event is decoded straight to its item (the JSONL store's ``read_turns`` does the same over
its lines). Every other event is decoded too, so a row that does not decode is damage here
as in a read of events. Profiled on a 50,000-item SQLite thread (thread CPU, medians): the
chunked ``read_sync`` + ``TurnFold`` path cost ~154 ms, this pass ~105 ms; reading only
the event column (no sequence, no time) saved ~3 ms of that.

:func:`turns_from_chunks` does the same from windows of rows the database has joined into
one document each (SQLite's ``group_concat``, 512 rows a window): one ``orjson`` call per
window instead of a row tuple, a bytes object and a call per row (~83 ms instead of ~103 ms
of thread CPU for the store's whole pass on the same thread, medians, alternating).
Whatever it cannot vouch for (a row the exact decoder must read, a window that does not
split back into exactly its rows, an event that does not decode) it leaves to
:func:`turns_from_rows`, whose errors are the damage errors.
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


SEPARATOR = b",null,"
"""What a window's rows are joined with: a ``null`` between every two events, so a window
parses to ``2n - 1`` values with a ``null`` at every odd index only when each row is one
JSON value of its own (a damaged row that ran into the next one shifts or swallows them)."""


def window_events(joined: bytes | None, count: int, marked: int) -> list[Any] | None:
    """Return the event dicts of one window of ``count`` rows joined with :data:`SEPARATOR`.

    ``marked`` is how many of the rows may start with the codec's exact mark (they must be
    read with the exact decoder: any row that does not start with ``{``, counted by the
    database). None when the window cannot be vouched for: a row is marked, the document
    is not JSON, or it does not split back into ``count`` values separated by ``null``.
    """
    if not count:
        return []
    if marked or not joined:
        return None
    try:
        values = orjson.loads(b"[%s]" % joined)
    except orjson.JSONDecodeError:
        return None
    if len(values) != 2 * count - 1 or values[1::2].count(None) != count - 1:
        return None
    events: list[Any] = values[::2]
    return events


def turns_from_chunks(windows: Iterable[list[Any] | None], last: int) -> tuple[Turn, ...] | None:
    """Return the transcript items of events 1..``last``, given as windows of event dicts.

    ``windows`` yields :func:`window_events` of consecutive windows of a thread's events in
    sequence order, covering 1..``last`` exactly. Return None (read the rows one by one
    with :func:`turns_from_rows`, which names what is wrong) when a window is None, an event
    does not decode, or the events are not ``last``. The loop is :func:`turns_from_rows`'s.
    """
    turns: list[Turn] = []
    items: list[Any] = []
    turn_id: Any = None
    decoders, decode = event_decoders(), from_dict
    count = 0
    with gc_paused():
        try:
            for events in windows:
                if events is None:
                    return None
                count += len(events)
                for data in events:
                    if data["type"] == "item_completed" and len(data) == 3:
                        item = data["item"]
                        try:
                            item = decoders[item["type"]](item)
                        except (KeyError, TypeError):
                            item = decode(data).item  # the codec's error or its general path
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
        except (ValueError, KeyError, TypeError, IndexError):
            return None
    if count != last:
        return None
    if items:
        turns.append(Turn(turn_id, tuple(items)))
    return tuple(turns)


__all__ = ["SEPARATOR", "RowsNotWhole", "turns_from_chunks", "turns_from_rows", "window_events"]
