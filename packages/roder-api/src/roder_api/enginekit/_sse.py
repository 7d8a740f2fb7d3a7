"""A small server-sent events decoder (the WHATWG event-stream format) over raw bytes.

Lines end in CRLF, LF or CR; lines starting with ``:`` are comments; several ``data`` lines
of one event are joined with ``\\n``; a blank line dispatches the event. Lines are split on
bytes, never with ``str.splitlines`` (which would also split a JSON payload at U+2028 and
friends). An event cut off by the end of the stream is not dispatched.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import Any

import orjson

from roder_api.inference import ProviderFailure, ProviderFailureKind


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its type (``message`` by default), data, id and retry hint."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turn chunks of bytes into :class:`ServerSentEvent` values, one ``feed`` at a time."""

    def __init__(self) -> None:
        self._buffer = b""
        self._first_line = True
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Return the events completed by ``chunk`` (possibly none).

        Linear in the chunk: lines are cut at a moving position, and a buffer with no CR is
        searched for one only once (a provider's many events in one large chunk cost no
        more than the same events one at a time).
        """
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[ServerSentEvent] = []
        size, pos = len(buffer), 0
        cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
        while cr != -1 or lf != -1:
            start = pos
            if cr != -1 and (lf == -1 or cr < lf):
                if cr == size - 1:
                    break  # a CR at the end of the buffer may be the first half of a CRLF
                end = cr
                pos = cr + (2 if buffer[cr + 1 : cr + 2] == b"\n" else 1)
            else:
                end, pos = lf, lf + 1
            event = self._line(buffer[start:end].decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
            if cr != -1 and cr < pos:
                cr = buffer.find(b"\r", pos)
            if lf != -1 and lf < pos:
                lf = buffer.find(b"\n", pos)
        self._buffer = buffer[pos:]
        return events

    def end(self) -> list[ServerSentEvent]:
        """Return the events completed at the end of the stream (a final lone CR line)."""
        if self._buffer.endswith(b"\r"):
            return self.feed(b"\n")
        return []

    def _line(self, line: str) -> ServerSentEvent | None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent(
            event=event or "message", data="\n".join(data), id=self._last_id, retry=self._retry
        )


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncGenerator[ServerSentEvent, None]:
    """Yield the events of a byte stream as they complete."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.end():
        yield event


def event_json(sse: ServerSentEvent) -> Any:
    """Return an event's data parsed as JSON.

    Raise ``ProviderFailure`` (``OTHER``, not retried) when it is not JSON: a provider that
    sends a broken event has broken its own format.
    """
    try:
        return orjson.loads(sse.data)
    except orjson.JSONDecodeError:
        raise ProviderFailure(
            ProviderFailureKind.OTHER,
            f"the server sent an event that is not JSON ({sse.event})",
        ) from None
