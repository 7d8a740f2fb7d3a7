"""The SSE stream of a thread: the journal from a sequence on, then live, then keepalives.

Everything sent is read from the journal (persist before deliver, end to end): a stream
reads the events after the last sequence it sent, and when there are none waits with
``ThreadStore.wait_for_events`` (bounded by ``heartbeat_s``; a ``: keepalive`` comment
goes out each time a wait ends with nothing new). Sequences are strictly increasing with
no gap: a reconnect with ``Last-Event-ID: N`` (or ``?after=N``) continues at ``N + 1``
from any process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from roder_api.codec import to_dict
from roder_api.events import JournalEvent, TurnAborted, TurnComplete
from roder_api.threads import ThreadStore

_PAGE = 512
"""How many journal events one read of a stream takes."""


def sse_message(entry: JournalEvent) -> bytes:
    """Return one SSE message: ``id:`` the sequence, ``event:`` the type, ``data:`` the JSON."""
    data = orjson.dumps(to_dict(entry))
    kind = entry.event.TYPE.encode()
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (entry.sequence, kind, data)


async def journal_stream(
    store: ThreadStore,
    thread_id: str,
    after: int,
    *,
    heartbeat_s: float,
    until_turn_end: bool = False,
) -> AsyncIterator[bytes]:
    """Yield the SSE messages of every event after ``after``, then live ones, forever (or
    until the first turn end sent, with ``until_turn_end``)."""
    yield b"retry: 1000\n\n"
    while True:
        entries = await store.read_events(thread_id, after=after, limit=_PAGE)
        for entry in entries:
            if entry.sequence != after + 1:
                # Never skip: read again from the last sequence sent.
                break
            after = entry.sequence
            yield sse_message(entry)
            if until_turn_end and isinstance(entry.event, (TurnComplete, TurnAborted)):
                return
        if len(entries) >= _PAGE:
            continue
        last = await store.wait_for_events(thread_id, after, heartbeat_s)
        if last <= after:
            yield b": keepalive\n\n"
