"""The snapshot pass: a whole journal's transcript items, grouped into turns.

:func:`read_turns` returns what ``turns_from_events(read_events(...))`` would, without a
journal event per line, and frames the journal a block (:data:`READ_CHUNK` bytes of whole
lines) at a time rather than a line at a time: the block is split into lines, every line's
end, checksum field and CRC-32 are checked with one C-level ``map`` each, and the records
of the block are parsed with one ``orjson`` call (their bytes joined into one JSON array).
Measured on a 50,000-item journal (thread CPU, medians, alternating): ~148 ms a line at a
time, ~135 ms by blocks of 16-64 KiB (larger blocks lose the gain to the cache; counting
the ``}\\n`` ends with ``bytes.count`` instead cost more than it saved).

Whatever a block cannot vouch for (a line that fails a check, a record the codec wrote for
the exact decoder, a record that does not fold) is read again a line at a time, exactly as
before, so damage is reported at the same line and offset with the same reason. Only the
first damage matters: the pass stops there.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import operator
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast

import orjson

from roder_api.codec import EXACT_MARK, event_decoders, from_dict, loads_json
from roder_api.errors import StoreCorruptedError
from roder_api.events import ItemCompleted
from roder_api.threads import Turn
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
from roder_jsonl_thread_store._lines import cut_short, damaged, newer_format, out_of_order

READ_CHUNK = 65536
"""How many bytes :func:`read_turns` reads at a time (it frames the whole lines in them)."""

_TAIL_LEN = len(LINE_END)
_EXACT = EXACT_MARK[0]
_CLOSE = LINE_END[:1]
_BODY = slice(RECORD_START, -1)  # of a line without its newline
_HEX = slice(CRC_START, CRC_END)
_FIRST = operator.itemgetter(0)
_LAST = operator.itemgetter(-1)
_LINE_CHECK_ERRORS = (ValueError, KeyError, TypeError, IndexError)


def _turn_builder() -> Callable[[Any, tuple[Any, ...]], Turn]:
    """Return a constructor of :class:`Turn` that fills its two slots directly.

    What the frozen dataclass's ``__init__`` does (through ``object.__setattr__``), about
    twice as fast: a snapshot builds a turn every few items. Falls back to the class
    itself if ``Turn`` ever has other fields or a ``__post_init__``.
    """
    names = [f.name for f in dataclasses.fields(Turn)]
    slots = vars(Turn)
    if names != ["turn_id", "items"] or hasattr(Turn, "__post_init__"):
        return Turn  # pragma: no cover - not today
    new, set_turn_id, set_items = object.__new__, slots["turn_id"].__set__, slots["items"].__set__

    def build(turn_id: Any, items: tuple[Any, ...]) -> Turn:
        turn = new(Turn)
        set_turn_id(turn, turn_id)
        set_items(turn, items)
        return turn

    return build


_new_turn = _turn_builder()


class _Fold:
    """What the pass has so far: the turns, the open turn's items, the next sequence."""

    __slots__ = ("expected", "items", "turn_id", "turns")

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.items: list[Any] = []
        self.turn_id: Any = None
        self.expected = 1  # as in read_events: sequences are checked, not taken from the index

    def mark(self) -> tuple[int, list[Any], int, Any, int]:
        """Return where the fold is, for :meth:`reset`."""
        return len(self.turns), self.items, len(self.items), self.turn_id, self.expected

    def reset(self, mark: tuple[int, list[Any], int, Any, int]) -> None:
        """Go back to ``mark``: forget what was folded since."""
        turns, items, count, self.turn_id, self.expected = mark
        del self.turns[turns:]
        del items[count:]
        self.items = items

    def result(self) -> tuple[Turn, ...]:
        """Return the turns, the open one closed."""
        if self.items:
            self.turns.append(_new_turn(self.turn_id, tuple(self.items)))
        return tuple(self.turns)


def _fold(records: Iterable[Any], fold: _Fold, path: Path | str) -> None:
    """Fold journal records into ``fold``: the transcript items by turn, sequences checked.

    The grouping is ``TurnFold.add`` written inline: the method call per item measured ~7 %
    slower. Every event is decoded (one that does not decode raises, as in a read of
    events). Raises ``ValueError``, ``KeyError``, ``TypeError`` or ``IndexError`` for a
    record that is damage, :func:`newer_format`'s error for a newer one.
    """
    turns, items, turn_id, expected = fold.turns, fold.items, fold.turn_id, fold.expected
    decoders, decode, new_turn = event_decoders(), from_dict, _new_turn
    try:
        for record in records:
            if record["v"] > FORMAT_VERSION:
                raise newer_format(path, record["v"])
            if record["k"] != "events":
                continue
            events = record["events"]
            if record["seq"] != expected:
                raise ValueError(out_of_order(record["seq"], expected))
            expected += len(events)
            for event in events:
                if event["type"] == "item_completed" and len(event) == 3:
                    # ItemCompleted's own decoder, without building the event.
                    item = event["item"]
                    try:
                        item = decoders[item["type"]](item)
                    except (KeyError, TypeError):
                        item = decode(event).item  # the codec's own error or its general path
                    owner = event["turn_id"]
                else:
                    try:
                        decoded = decoders[event["type"]](event)
                    except (KeyError, TypeError):
                        decoded = decode(event)  # the codec's own error for a bad event
                    if not isinstance(decoded, ItemCompleted):
                        continue
                    item, owner = decoded.item, decoded.turn_id
                if owner != turn_id:
                    if items:
                        turns.append(new_turn(turn_id, tuple(items)))
                        items = []
                    turn_id = owner
                items.append(item)
    finally:
        fold.items, fold.turn_id, fold.expected = items, turn_id, expected


def _fold_block(block: bytes, fold: _Fold, path: Path | str) -> int:
    """Fold a block of whole lines at once; return how many, or -1 when it cannot vouch
    for them (``fold`` is then as before: read the block a line at a time)."""
    lines = block.split(b"\n")
    lines.pop()  # what follows the last newline: nothing
    crc32, repeat = fast_crc32, itertools.repeat
    get = cast(Callable[[bytes, slice], bytes], operator.getitem)
    try:
        bodies = list(map(get, lines, repeat(_BODY)))
        if bytes(map(_LAST, lines)).strip(_CLOSE) or _EXACT in map(_FIRST, bodies):
            return -1  # a line cut short, or a record for the exact decoder
        # The checksums as the writer spells them (8 lowercase hex digits each), compared
        # in one go; any other spelling is left to the line-at-a-time read.
        sums = struct.pack(f">{len(bodies)}I", *map(crc32, bodies)).hex().encode()
        if sums != b"".join(map(get, lines, repeat(_HEX))):
            return -1
        records = orjson.loads(b"[%s]" % b",".join(bodies))
    except (ValueError, IndexError):  # orjson.JSONDecodeError is a ValueError
        return -1
    if len(records) != len(lines):
        return -1
    mark = fold.mark()
    try:
        _fold(records, fold, path)
    except _LINE_CHECK_ERRORS:
        fold.reset(mark)
        return -1
    return len(lines)


class _Journal(NamedTuple):
    """The journal a pass reads, for its damage errors."""

    core: StoreCore
    file: BinaryIO
    path: Path | str
    thread_id: str
    state: JournalState

    def damaged(self, where: tuple[int, int], exc: Exception) -> StoreCorruptedError:
        """Return :func:`damaged`'s error for the line at ``where`` (offset, number)."""
        return damaged(self.core, self.thread_id, self.path, self.state, self.file, where, exc)


def _fold_lines(block: bytes, fold: _Fold, where: tuple[int, int], journal: _Journal) -> None:
    """Fold a block a line at a time; raise the damage error of the first bad line.

    ``where`` is the block's byte offset and how many lines precede it. The checks are
    :func:`read_events`'s, line by line.
    """
    position, number = where
    parse, exact, crc32 = orjson.loads, loads_json, fast_crc32
    for raw in io.BytesIO(block):
        position += len(raw)
        number += 1
        try:
            body = raw[RECORD_START:-_TAIL_LEN]
            if crc32(body) != int(raw[CRC_START:CRC_END], 16) or raw[-_TAIL_LEN:] != LINE_END:
                raise ValueError("bad framing or checksum mismatch")
            record = parse(body) if body[0] != _EXACT else exact(body)
            _fold((record,), fold, journal.path)
        except _LINE_CHECK_ERRORS as exc:
            raise journal.damaged((position - len(raw), number), exc) from None


def read_turns(
    core: StoreCore, file: BinaryIO, path: Path | str, thread_id: str, state: JournalState
) -> tuple[Turn, ...]:
    """Return the transcript items of the whole journal (up to the state) grouped by turn.

    Reads ``state.size`` bytes a block at a time (see the module doc). What it reports,
    and where, is what a read a line at a time reports: the first line that fails a check
    (its offset and number), or, when the lines end before the state's last sequence, the
    end of what was read and the line after it.
    """
    journal = _Journal(core, file, path, thread_id, state)
    fold = _Fold()
    end = state.size
    position = number = 0  # the bytes and lines folded so far
    pending = b""  # the start of a line the last read cut
    remaining = end
    file.seek(0)
    while remaining > 0:
        data = file.read(min(READ_CHUNK, remaining))
        if not data:
            break
        remaining -= len(data)
        cut = data.rfind(b"\n") + 1
        if not cut:
            pending += data
            continue
        block = pending + data[:cut] if pending else data[:cut]
        pending = data[cut:]
        count = _fold_block(block, fold, path)
        if count < 0:
            _fold_lines(block, fold, (position, number), journal)
            count = block.count(b"\n")
        position += len(block)
        number += count
    beyond = file.read(1) if remaining == 0 else b""
    if pending and not beyond:
        # The file ends inside the state without a newline: a line cut short.
        _fold_lines(pending, fold, (position, number), journal)
    elif pending or beyond:
        # A line-at-a-time read stops at the line that crosses the state's end, counted.
        position, number = end + 1, number + 1
    if fold.expected - 1 != state.metadata.last_sequence:
        where = (min(position, end), number + 1)
        raise journal.damaged(where, cut_short(fold.expected, state))
    return fold.result()
