"""A small server-sent events decoder over raw bytes (the WHATWG event-stream format).

Lines end in CRLF, LF or CR and are split on bytes (never with ``str.splitlines``, which
would also split a JSON payload at U+2028); ``:`` lines are comments; several ``data`` lines
of one event are joined with ``\\n``; a blank line dispatches the event; an event cut off by
the end of the stream is never dispatched.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its type (``message`` by default) and its data."""

    event: str = "message"
    data: str = ""


class SSEDecoder:
    """Turn chunks of bytes into :class:`ServerSentEvent` values, one ``feed`` at a time."""

    def __init__(self) -> None:
        self._buffer = b""
        self._first = True
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Return the events completed by ``chunk`` (possibly none)."""
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        while True:
            match = _LINE_END.search(self._buffer)
            if match is None:
                return events
            if match.group() == b"\r" and match.end() == len(self._buffer):
                return events  # a CR at the end may be the first half of a CRLF
            raw, self._buffer = self._buffer[: match.start()], self._buffer[match.end() :]
            event = self._line(raw.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)

    def end(self) -> list[ServerSentEvent]:
        """Return the events completed at the end of the stream (a final lone CR line)."""
        return self.feed(b"\n") if self._buffer.endswith(b"\r") else []

    def _line(self, line: str) -> ServerSentEvent | None:
        if self._first:
            self._first = False
            line = line.removeprefix("\ufeff")
        if not line:
            data, event = self._data, self._event
            self._data, self._event = [], ""
            return ServerSentEvent(event or "message", "\n".join(data)) if data else None
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncGenerator[ServerSentEvent, None]:
    """Yield the events of a byte stream as they complete."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.end():
        yield event
