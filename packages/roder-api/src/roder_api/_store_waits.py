"""The default bodies of ``ThreadStore.wait_for_events`` and ``threads_with_pending_input``.

Apart from the contract module to keep it small; a store overrides the methods, not these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio

from roder_api.errors import ThreadNotFoundError
from roder_api.events import InputAccepted, JournalEvent, TurnAborted, TurnComplete, TurnStarted

if TYPE_CHECKING:
    from roder_api._thread_contract import ThreadStore


def open_turns(entries: Iterable[JournalEvent]) -> set[str]:
    """Return the turn ids of ``entries`` accepted or started and not ended there."""
    pending: set[str] = set()
    for entry in entries:
        event = entry.event
        if isinstance(event, TurnStarted) or (isinstance(event, InputAccepted) and not event.steer):
            pending.add(event.turn_id)
        elif isinstance(event, (TurnComplete, TurnAborted)):
            pending.discard(event.turn_id)
    return pending


async def poll_for_events(
    store: ThreadStore, thread_id: str, after_sequence: int, timeout_s: float
) -> int:
    """Poll the metadata's ``last_sequence`` (pauses growing from ``store.wait_poll_s[0]``
    to ``[1]``) until it is above ``after_sequence`` or ``timeout_s`` passed; return it."""
    deadline = anyio.current_time() + max(0.0, timeout_s)
    pause, longest = store.wait_poll_s
    while True:
        last = (await store.get_thread(thread_id)).last_sequence
        left = deadline - anyio.current_time()
        if last > after_sequence or left <= 0:
            return last
        await anyio.sleep(min(pause, left))
        pause = min(pause * 2, longest)


async def find_pending_input(store: ThreadStore, updated_after_ms: int, limit: int) -> list[str]:
    """Walk the listing down to ``updated_after_ms``; return the threads whose newest
    ``store.pending_tail`` events hold a turn accepted or started and not ended."""
    found: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=100)
        for metadata in page.threads:
            if metadata.updated_at_ms < updated_after_ms:
                return found
            if not metadata.last_sequence:
                continue
            try:
                tail = await store.event_page(metadata.thread_id, limit=store.pending_tail)
            except ThreadNotFoundError:
                continue  # deleted meanwhile
            if open_turns(tail.events):
                found.append(metadata.thread_id)
                if len(found) >= limit:
                    return found
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor
