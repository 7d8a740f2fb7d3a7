"""The journal file format: one checksummed JSON line per record.

A line is ``{"c":"<crc32 hex>","r":<record>}`` followed by ``\\n``, where the CRC-32 covers the
record's bytes exactly as written. This module is the only place the framing is written: the
reader, the writer and fsck use its functions and constants.

Records are JSON objects with a format version ``v`` and a kind ``k``:

- ``create``: the thread's metadata (always the first line);
- ``events``: one committed batch: ``seq`` (the first event's sequence), ``t`` (ms), ``events``;
- ``meta``: a metadata change (``title``, ``extra``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from roder_api.codec import EXACT_MARK, dumps_json, loads_json

FORMAT_VERSION = 1
"""The major format version this code writes and reads."""


def _fast_crc32() -> Callable[[Any], int]:
    """Return ISA-L's CRC-32 (``isal``) where it is installed, else ``zlib.crc32``.

    The same checksum (CRC-32, the zlib polynomial: every journal ever written reads the
    same), computed with carry-less multiplication: on a 50,000-item journal's lines,
    ~3.5 ms against zlib's ~14 ms (benchmarks/README.md, "Against the peer, workload by
    workload", "What was tried for JSONL's W3"). ``isal`` has wheels for x86-64 and ARM64;
    elsewhere the store uses zlib's.
    """
    try:
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - a platform without isal's wheels
        return zlib.crc32
    return isal_zlib.crc32


crc32: Callable[[Any], int] = _fast_crc32()
"""The CRC-32 of bytes (any buffer): ``zlib.crc32``'s value, faster where ``isal`` is in."""

_PREFIX = b'{"c":"'
_MIDDLE = b'","r":'

CRC_START = len(_PREFIX)
"""Where the checksum's 8 hex digits start in a line."""
CRC_END = CRC_START + 8
"""Where they end."""
RECORD_START = CRC_END + len(_MIDDLE)
"""Where the record's JSON starts in a line."""
LINE_END = b"}\n"
"""How every complete line ends: the frame's closing brace and the newline."""
NEWLINE = b"\n"
"""The line terminator: a line without it is torn (its write never completed)."""


def record_of(raw: bytes) -> bytes:
    """Return the record's JSON bytes of a complete line ``raw`` (with its newline)."""
    return raw[RECORD_START : -len(LINE_END)]


def checksum_field(raw: bytes) -> int:
    """Return the checksum written in a line; raise ``ValueError`` when it is not hex."""
    return int(raw[CRC_START:CRC_END], 16)


def line_crc(line: bytes) -> int:
    """Return the checksum written in a framed line (0 when it has none)."""
    try:
        return checksum_field(line)
    except ValueError:
        return 0


def frame_is_intact(raw: bytes) -> bool:
    """Return True when a line ``raw`` (with its newline) is complete and its checksum holds.

    The fast check of the read path; :func:`parse_line` also checks the frame byte for byte.
    """
    try:
        return raw[-2:] == LINE_END and crc32(record_of(raw)) == checksum_field(raw)
    except ValueError:
        return False


def frame(record: bytes) -> bytes:
    """Return the journal line (with newline) for the JSON bytes of a record."""
    return b"%s%08x%s%s}\n" % (_PREFIX, crc32(record), _MIDDLE, record)


def encode_record(record: dict[str, Any]) -> bytes:
    """Return the journal line for a record dict (``UnserializableEventError`` if it cannot)."""
    return frame(dumps_json(record))


def events_list(payloads: Sequence[bytes]) -> bytes:
    """Return the JSON list of events from each event's codec bytes (``dumps_each``).

    Starts with the codec's exact mark when any event needed it, as the codec asks of a
    document that embeds its bytes.
    """
    joined = b"[%s]" % b",".join(payloads)
    if any(payload[:1] == EXACT_MARK for payload in payloads):
        return EXACT_MARK + joined
    return joined


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
    if len(line) < RECORD_START + 2 or not line.startswith(_PREFIX) or line[-1:] != b"}":
        raise BadLine("bad framing")
    if line[CRC_END:RECORD_START] != _MIDDLE:
        raise BadLine("bad framing")
    body = line[RECORD_START:-1]
    try:
        expected = checksum_field(line)
    except ValueError:
        raise BadLine("bad checksum field") from None
    if crc32(body) != expected:
        raise BadLine("checksum mismatch")
    try:
        record = loads_json(body)
    except orjson.JSONDecodeError:
        raise BadLine("bad JSON") from None
    if not isinstance(record, dict) or "k" not in record or "v" not in record:
        raise BadLine("not a journal record")
    return record
