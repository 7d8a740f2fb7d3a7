"""Events journaled in the store call that makes a new thread, after its first events.

A session that creates its thread hands the create the turn's first events; the model's
first output often comes while that create is still with a worker thread. Appending it
after the create returns costs a second hand-off to a worker and back, on the path to the
first streamed token. A :class:`FollowOn` lets the event loop offer events to the store
call in flight: the worker takes what was offered when it starts (those join the create's
own write), a store may take more while it makes the thread (the JSONL store: once the
journal is linked, synced before its directory is), and the worker takes the rest when
the create is done (one more append in the same worker call, :meth:`FollowOn.finish`);
from then on offers are refused, so they go the usual way, after it.

Offers are taken in order and never split: an event is either in the store call's result
(``LeasedThread.entries``, after the first events) or refused. The object is thread-safe
(one lock, held only to move a list).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from roder_api.codec import dumps
from roder_api.events import Event, JournalEvent


class FollowOn:
    """Events offered to a new thread's store call while it runs (see the module docstring).

    :meth:`offer` (the event loop) adds an event unless the channel is closed; the store
    (any thread) :meth:`take`\\ s what came so far and finally :meth:`close`\\ s it. ``error``
    is the failure of the append that journaled what came last, when it failed (the thread
    and its first events stand).
    """

    __slots__ = ("_events", "_lock", "_open", "_payloads", "error")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._payloads: list[bytes] = []
        self._open = True
        self.error: BaseException | None = None

    @property
    def open(self) -> bool:
        """Return True while offers are accepted."""
        return self._open

    def offer(self, event: Event, payload: bytes | None = None) -> bool:
        """Add ``event`` (its codec bytes, made now when None); False once closed."""
        if not self._open:
            return False
        data = payload if payload is not None else dumps(event)
        with self._lock:
            if not self._open:
                return False
            self._events.append(event)
            self._payloads.append(data)
            return True

    def take(self) -> tuple[list[Event], list[bytes]]:
        """Return what was offered since the last take, and its bytes (in order)."""
        with self._lock:
            events, self._events = self._events, []
            payloads, self._payloads = self._payloads, []
        return events, payloads

    def close(self) -> tuple[list[Event], list[bytes]]:
        """Refuse offers from now on; return what was offered and not yet taken."""
        with self._lock:
            self._open = False
            events, self._events = self._events, []
            payloads, self._payloads = self._payloads, []
        return events, payloads

    def finish(
        self, append: Callable[[list[Event], list[bytes]], list[JournalEvent]]
    ) -> list[JournalEvent]:
        """:meth:`close`, then journal what was not yet taken with ``append`` (the store's
        own append, in the same worker call); return its entries. None are journaled when
        none came, or when ``error`` is already set (the rest is refused: it goes after,
        or not at all). A failure of ``append`` is kept in ``error``, not raised."""
        events, payloads = self.close()
        if not events or self.error is not None:
            return []
        try:
            return append(events, payloads)
        except Exception as exc:  # noqa: BLE001 - the caller learns it from error
            self.error = exc
            return []


__all__ = ["FollowOn"]
