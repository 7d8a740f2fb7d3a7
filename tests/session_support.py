"""What the session tests share: a session's events up to a turn's end, their text, the journal;
the ``add`` tool the scripted engine calls."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    Event,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.tools import tool
from roder_runtime import Runtime, Session

TERMINAL = (TurnComplete, TurnAborted)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


async def events_until(
    session: Session, done: type[Event] | tuple[type[Event], ...] = TERMINAL, count: int = 1
) -> list[JournalEvent]:
    """Return the session's events up to and including the ``count``-th ``done`` event."""
    seen: list[JournalEvent] = []
    with anyio.fail_after(20):
        while count:
            entry = await session.next_event()
            seen.append(entry)
            if isinstance(entry.event, done):
                count -= 1
    return seen


def text_of(
    entries: Sequence[JournalEvent], phase: ContentPhase = ContentPhase.FINAL_ANSWER
) -> str:
    return "".join(
        e.event.delta
        for e in entries
        if isinstance(e.event, AssistantContentDelta) and e.event.phase is phase
    )


async def journal(runtime: Runtime, thread_id: str) -> list[Event]:
    return [e.event for e in (await runtime.event_page(thread_id, limit=100_000)).events]
