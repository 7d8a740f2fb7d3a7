"""The observer seam: hand each persisted batch to the registered observers, never blocking.

:class:`ObserverHub` is called by :class:`~roder_runtime.store._journal.ThreadJournal` right after
the store returned a batch (so observers see exactly what the journal holds, in order, and
nothing that failed to persist). ``offer`` is synchronous and O(observers): it puts the
batch into each observer's bounded queue, or drops it (counted, logged) when that queue is
full. The observers run in one daemon thread with an event loop of its own (asyncio), so a
slow or CPU-bound observer cannot stall the loop a turn runs on, whatever its backend; an
exception an observer raises is logged and the observer goes on with the next batch.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from roder_api.events import JournalEvent
from roder_api.observers import Observer

log = logging.getLogger("roder.observers")

DEFAULT_QUEUE_BATCHES = 1024
"""How many batches an observer's queue holds before new ones are dropped."""

CLOSE_TIMEOUT_S = 10.0
"""How long closing waits for observers to take their queued batches and close."""

_STOP = object()


@dataclass
class _Feed:
    """One observer, its bounded queue and what it lost."""

    observer: Observer
    queue: queue.Queue[tuple[str, tuple[JournalEvent, ...]] | object]
    dropped: int = 0
    failures: int = 0
    thread: threading.Thread | None = field(default=None, repr=False)


class ObserverHub:
    """Serves the observers of one runtime; ``offer`` never blocks, ``aclose`` ends it."""

    def __init__(
        self, observers: Sequence[Observer], *, queue_batches: int = DEFAULT_QUEUE_BATCHES
    ) -> None:
        # The feeds are made when the first batch comes: reading a registry's observers
        # imports the plugins that have them (lazy plugins), which a runtime that journals
        # nothing (`roder threads list`) never needs.
        self._observers = observers
        self._queue_batches = queue_batches
        self._feeds: list[_Feed] = []
        self._started = False
        self._closed = False
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Return how many batches were dropped for full queues, over all observers."""
        return sum(feed.dropped for feed in self._feeds)

    @property
    def failures(self) -> int:
        """Return how many batches an observer raised on (logged, not raised)."""
        return sum(feed.failures for feed in self._feeds)

    def offer(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        """Queue a persisted batch for every observer; drop it where a queue is full."""
        if self._closed or not events:
            return
        if not self._started:
            self._start()
        batch = (thread_id, tuple(events))
        for feed in self._feeds:
            try:
                feed.queue.put_nowait(batch)
            except queue.Full:
                feed.dropped += 1
                log.warning(
                    "observer %s is behind: dropped a batch of %d events of thread %r "
                    "(%d dropped so far)",
                    type(feed.observer).__name__,
                    len(events),
                    thread_id,
                    feed.dropped,
                )

    def _start(self, observers: Sequence[Observer] | None = None) -> None:
        with self._lock:
            if self._started:
                return
            chosen = self._observers if observers is None else observers
            self._feeds = [_Feed(o, queue.Queue(maxsize=self._queue_batches)) for o in chosen]
            for feed in self._feeds:
                feed.thread = threading.Thread(
                    target=_serve, args=(feed,), name="roder-observer", daemon=True
                )
                feed.thread.start()
            self._started = True

    async def aclose(self) -> None:
        """Hand over what is queued (bounded in time), close every observer, stop."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            # Closing runs in the observers' thread too, off this loop. Nothing was
            # journaled: close what is there without importing more (a registry's lazy
            # view says what is imported in `loaded`; a plain sequence is all there).
            self._start(getattr(self._observers, "loaded", self._observers))
        for feed in self._feeds:
            feed.queue.put(_STOP)  # unbounded wait is fine: the server thread drains it
        with anyio.move_on_after(CLOSE_TIMEOUT_S):
            for feed in self._feeds:
                thread = feed.thread
                if thread is not None:
                    await anyio.to_thread.run_sync(thread.join, CLOSE_TIMEOUT_S)


def _serve(feed: _Feed) -> None:
    """Run one observer's loop in this thread until it is told to stop."""
    anyio.run(_pump, feed)


async def _pump(feed: _Feed) -> None:
    while True:
        item = await anyio.to_thread.run_sync(feed.queue.get)
        if not isinstance(item, tuple):  # the stop marker
            break
        thread_id, events = item
        try:
            await feed.observer.observe(thread_id, events)
        except Exception:  # noqa: BLE001 - an observer's bug never reaches a turn
            feed.failures += 1
            log.exception("observer %s failed on a batch", type(feed.observer).__name__)
    await _close(feed)


async def _close(feed: _Feed) -> None:
    try:
        await feed.observer.aclose()
    except Exception:  # noqa: BLE001 - closing goes on for the other observers
        log.exception("observer %s failed to close", type(feed.observer).__name__)
