"""The journal file format: one checksummed JSON line per record.

A line is ``{"c":"<crc32 hex>","r":<record>}`` followed by ``\\n``, where the CRC-32 covers the
record's bytes exactly as written. Records are JSON objects with a format version ``v`` and a
kind ``k``:

- ``create``: the thread's metadata (always the first line);
- ``events``: one committed batch: ``seq`` (the first event's sequence), ``t`` (ms), ``events``;
- ``meta``: a metadata change (``title``, ``extra``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from roder_api.codec import EXACT_MARK, dumps_json, loads_json

FORMAT_VERSION = 1
"""The major format version this code writes and reads."""

_PREFIX = b'{"c":"'
_MIDDLE = b'","r":'
_RECORD_START = len(_PREFIX) + 8 + len(_MIDDLE)


def frame(record: bytes) -> bytes:
    """Return the journal line (with newline) for the JSON bytes of a record."""
    return b"%s%08x%s%s}\n" % (_PREFIX, zlib.crc32(record), _MIDDLE, record)


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the journal line for a record dict (``UnserializableEventError`` if it cannot)."""
    return frame(dumps_json(record))


def events_record(first_sequence: int, recorded_at_ms: int, events_json: bytes) -> bytes:
    """Return the journal line of an events batch whose events list is already JSON."""
    record = b'{"v":%d,"k":"events","seq":%d,"t":%d,"events":%s}' % (
        FORMAT_VERSION,
        first_sequence,
        recorded_at_ms,
        events_json,
    )
    if events_json[:1] == EXACT_MARK:
        # The codec's mark: the events need the exact decoder, so the record does too.
        record = EXACT_MARK + record
    return frame(record)


class BadLine(Exception):
    """Raised for a line whose framing, checksum or JSON is wrong."""


def parse_line(line: bytes) -> dict[str, Any]:
    """Return the record of a complete journal line (without its newline); raise BadLine."""
    if len(line) < _RECORD_START + 2 or not line.startswith(_PREFIX) or line[-1:] != b"}":
        raise BadLine("bad framing")
    if line[len(_PREFIX) + 8 : _RECORD_START] != _MIDDLE:
        raise BadLine("bad framing")
    body = line[_RECORD_START:-1]
    try:
        expected = int(line[len(_PREFIX) : len(_PREFIX) + 8], 16)
    except ValueError:
        raise BadLine("bad checksum field") from None
    if zlib.crc32(body) != expected:
        raise BadLine("checksum mismatch")
    try:
        record = loads_json(body)
    except orjson.JSONDecodeError:
        raise BadLine("bad JSON") from None
    if not isinstance(record, dict) or "k" not in record or "v" not in record:
        raise BadLine("not a journal record")
    return record


@dataclass(frozen=True, slots=True)
class ScannedLine:
    """One line of a journal as scanned: where it starts and ends, and what it holds."""

    offset: int
    end: int
    number: int
    record: dict[str, Any] | None
    error: str | None
    terminated: bool


def scan(file: BinaryIO, offset: int = 0, first_line_number: int = 1) -> Iterator[ScannedLine]:
    """Yield every line of ``file`` from ``offset``, parsed or with its error.

    Streams the file a line at a time; never holds the whole file in memory.
    """
    file.seek(offset)
    number = first_line_number
    position = offset
    for raw in file:
        end = position + len(raw)
        terminated = raw.endswith(b"\n")
        body = raw[:-1] if terminated else raw
        try:
            record: dict[str, Any] | None = parse_line(body)
            error = None
        except BadLine as exc:
            record, error = None, str(exc)
        yield ScannedLine(position, end, number, record, error, terminated)
        position = end
        number += 1
