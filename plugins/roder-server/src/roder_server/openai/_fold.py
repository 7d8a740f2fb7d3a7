"""A response's stream events, folded from its thread's journal (persist before deliver).

:func:`fold_response` reads the journal from the sequence the response's turn starts
after, in pages, never skipping a sequence. While it follows a running response it does
not read back what this process appends: each append's entries are handed to it in memory
once they are durable (``AppendWakeups.listen``), as ``/threads/{id}/stream`` is fed. Any
gap (a sequence that does not follow the last one folded), an append whose entries were
not handed over, an overflow of the hand-over, or an append by another process (a gap at
the next append here, or found by ``ThreadStore.wait_for_events``, which is asked only once
the thread has been quiet here for :data:`LOCAL_S`) sends it back to the store. So a live
response costs one store read at its start, not one per append, and the first delta goes
out as soon as its append is durable.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from roder_api.events import JournalEvent
from roder_api.threads import ThreadStore
from roder_server.openai._projection import ResponseProjection

PAGE = 512
"""How many journal events one read of a response's fold takes."""

WAIT_S = 5.0
"""The deadline of one wait for new events (``wait_for_events``) while a response runs
and nothing is appended here: an append by another process is found by the store's own
wake-up (``LISTEN/NOTIFY``) or poll."""

LOCAL_S = 0.25
"""How long after an append here the fold waits for the next one to be handed over,
without asking the store (``wait_for_events``: a store call per wake)."""

HANDED_LIMIT = 4096
"""How many handed-over entries a fold holds; past it the oldest go and it reads them."""


class AppendFeed:
    """What this process appends to a thread from now on: entries in append order, or
    ``stale`` (read the store); ``wake`` set at each hand-over, ``local_at`` the time of
    the last. Listened to weakly: :meth:`close` ends it, and a feed nobody holds any more
    (a response whose stream never started) is forgotten at the thread's next append."""

    __slots__ = ("__weakref__", "_forget", "entries", "local_at", "stale", "wake")

    def __init__(self, store: ThreadStore, thread_id: str) -> None:
        self.entries: deque[JournalEvent] = deque(maxlen=HANDED_LIMIT)
        self.stale = False
        self.wake = anyio.Event()
        self.local_at = -LOCAL_S
        ref = weakref.ref(self)

        def deliver(entries: Sequence[JournalEvent]) -> None:
            feed = ref()
            if feed is None:
                forget()
            else:
                feed.take(entries)

        forget = store.append_wakeups.listen(thread_id, deliver)
        self._forget = forget

    def take(self, entries: Sequence[JournalEvent]) -> None:
        """Take the entries of one durable append (none: read them from the store)."""
        if entries:
            self.entries.extend(entries)
        else:
            self.stale = True  # the store did not say what it appended: read it
        self.local_at = anyio.current_time()
        self.wake.set()

    def close(self) -> None:
        """Stop listening."""
        self._forget()

    def first_of(self, turn_id: str) -> int | None:
        """Return the sequence of the first entry handed over of turn ``turn_id`` (None
        when none was, or some may be lost: stale, or full and dropping the oldest)."""
        if self.stale or len(self.entries) == self.entries.maxlen:
            return None
        for entry in self.entries:
            if getattr(entry.event, "turn_id", None) == turn_id:
                return entry.sequence
        return None


async def fold_response(
    store: ThreadStore,
    projection: ResponseProjection,
    *,
    follow: bool,
    runs_here: bool = False,
    feed: AppendFeed | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Yield the stream events of a response from the journal, one at a time (what
    :func:`fold_batches` yields, flattened)."""
    async for batch in fold_batches(
        store, projection, follow=follow, runs_here=runs_here, feed=feed
    ):
        for event in batch:
            yield event


async def fold_batches(
    store: ThreadStore,
    projection: ResponseProjection,
    *,
    follow: bool,
    runs_here: bool = False,
    feed: AppendFeed | None = None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """Yield the stream events of a response from the journal, in batches: the events of
    every entry at hand (a read, or what was handed over) together, so that a stream
    writes them at once; with ``follow``, wait for more (handed over in memory when
    appended here) until the turn ends.

    ``runs_here``: the response's turn runs in this process (its session is here), so its
    first appends are handed over too: the fold waits for them (up to :data:`LOCAL_S`)
    before it asks the store. ``feed``: the thread's appends here, listened to since
    before ``projection.last_journal_sequence`` was read (the response was created here):
    the fold starts from what it was handed, without a read unless there is a gap. The
    fold closes it.
    """
    if not follow:
        if feed is not None:
            feed.close()
        async for whole in _read_to_end(store, projection):
            yield whole
        return
    read = feed is None
    if feed is None:
        # Listening before the first read: whatever commits after it is handed over.
        feed = AppendFeed(store, projection.thread_id)
    handed = feed
    if runs_here:
        handed.local_at = anyio.current_time()
    try:
        after = projection.last_journal_sequence
        while not projection.done:
            batch: list[dict[str, Any]] = []
            if read or handed.stale:
                handed.entries.clear()  # the read covers all of it (cleared before it)
                handed.stale = False
                entries = await store.read_events(projection.thread_id, after=after, limit=PAGE)
                for entry in entries:
                    if entry.sequence != after + 1:
                        break  # read again from the last sequence folded
                    after = entry.sequence
                    batch += projection.feed(entry)
                read = len(entries) >= PAGE
                if batch:
                    yield batch
                continue
            while handed.entries and not handed.stale and not projection.done:
                entry = handed.entries.popleft()
                if entry.sequence <= after:
                    continue  # the read had it
                if entry.sequence != after + 1:
                    read = True  # a gap (another process's append, an overflow): read it
                    break
                after = entry.sequence
                batch += projection.feed(entry)
            if batch:
                yield batch
            if read or handed.stale or handed.entries or projection.done:
                continue
            handed.wake = anyio.Event()
            if anyio.current_time() - handed.local_at < LOCAL_S:
                # Busy here: the next append is handed over; no store call per append.
                with anyio.move_on_after(LOCAL_S):
                    await handed.wake.wait()
                continue
            last = await store.wait_for_events(projection.thread_id, after, WAIT_S)
            if last > after and not handed.entries and not handed.stale:
                read = True  # not appended here: another process, or no entries said
    finally:
        handed.close()


async def _read_to_end(
    store: ThreadStore, projection: ResponseProjection
) -> AsyncIterator[list[dict[str, Any]]]:
    after = projection.last_journal_sequence
    while not projection.done:
        entries = await store.read_events(projection.thread_id, after=after, limit=PAGE)
        batch = []
        for entry in entries:
            if entry.sequence != after + 1:
                break
            after = entry.sequence
            batch += projection.feed(entry)
        if batch:
            yield batch
        if len(entries) < PAGE:
            return
