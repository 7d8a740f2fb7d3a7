"""The default bodies of ``ThreadStore.wait_for_events`` and ``threads_with_pending_input``,
and the fold of a journal's open turns (what ``ThreadMetadata.open_turns`` holds).

Apart from the contract module to keep it small; a store overrides the methods, not these.
:class:`AppendWakeups` is the in-process half of ``wait_for_events``: an append that
commits in this process wakes the waiters of its thread at once (in the appender's event
loop); the poll stays, for appends by other processes.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import anyio
import anyio.lowlevel

from roder_api.errors import ThreadNotFoundError
from roder_api.events import (
    Event,
    InputAccepted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)

if TYPE_CHECKING:
    from roder_api._thread_contract import ThreadStore

TURN_EVENT_TYPES: frozenset[type[Event]] = frozenset(
    {TurnStarted, InputAccepted, TurnComplete, TurnAborted}
)
"""The event classes that open or end a turn: only these change the open turns."""

TURN_EVENT_TAGS: frozenset[str] = frozenset(cls.TYPE for cls in TURN_EVENT_TYPES)
"""Their ``type`` tags, for a fold over undecoded events (the JSONL scan)."""


def _opened(event: Event) -> str | None:
    """Return the turn id ``event`` opens, else None."""
    if isinstance(event, TurnStarted) or (isinstance(event, InputAccepted) and not event.steer):
        return event.turn_id
    return None


def turn_change(open_turns: tuple[str, ...], event: Event) -> tuple[str, ...]:
    """Return ``open_turns`` after ``event`` (the same tuple when it changes nothing).

    A turn opens at its ``TurnStarted`` or at the ``InputAccepted`` of input that starts it
    (not a steer), and ends at its ``TurnComplete`` or ``TurnAborted``; ids stay in the
    order they opened.
    """
    if isinstance(event, (TurnComplete, TurnAborted)):
        if event.turn_id in open_turns:
            return tuple(turn for turn in open_turns if turn != event.turn_id)
        return open_turns
    turn_id = _opened(event)
    if turn_id is not None and turn_id not in open_turns:
        return (*open_turns, turn_id)
    return open_turns


def open_turns_after(
    open_turns: tuple[str, ...], entries: Iterable[JournalEvent]
) -> tuple[str, ...]:
    """Return ``open_turns`` advanced over journal ``entries`` (see :func:`turn_change`)."""
    kinds = TURN_EVENT_TYPES
    for entry in entries:
        event = entry.event
        if type(event) in kinds:
            open_turns = turn_change(open_turns, event)
    return open_turns


def open_turns(entries: Iterable[JournalEvent]) -> set[str]:
    """Return the turn ids of ``entries`` accepted or started and not ended there."""
    return set(open_turns_after((), entries))


AppendListener: TypeAlias = Callable[[Sequence[JournalEvent]], None]
"""A callback of :meth:`AppendWakeups.listen`: the entries an append made durable."""


class AppendWaiter:
    """One task waiting on a thread: its event, its event loop, the sequence it was woken
    with (0 until then)."""

    __slots__ = ("event", "last", "token")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.token = anyio.lowlevel.current_token()
        self.last = 0


class AppendWakeups:
    """The waiters of one store object, by thread id; :meth:`wake` sets those of a thread.

    An event belongs to its event loop: :meth:`wake` sets only the waiters of the loop it
    is called from (where the append ran); a waiter of another loop or thread is not
    touched and finds the append by its poll, as a waiter in another process does.
    :meth:`listen` callbacks get the appended entries themselves (same loop only).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[AppendWaiter]] = {}
        self._listeners: dict[str, list[tuple[object, AppendListener]]] = {}

    def add(self, thread_id: str) -> AppendWaiter:
        """Return a new waiter of ``thread_id`` (in the current event loop)."""
        waiter = AppendWaiter()
        with self._lock:
            self._waiters.setdefault(thread_id, []).append(waiter)
        return waiter

    def discard(self, thread_id: str, waiter: AppendWaiter) -> None:
        """Forget ``waiter``."""
        with self._lock:
            waiters = self._waiters.get(thread_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[thread_id]

    def listen(self, thread_id: str, callback: AppendListener) -> Callable[[], None]:
        """Call ``callback(entries)`` on each append to ``thread_id`` that this store makes in
        the current event loop, once it is durable and before its waiters wake; return the
        function that stops it. ``entries`` is empty when the store did not say what it
        appended (read them). Appends by other loops or processes are not seen here."""
        item = (anyio.lowlevel.current_token(), callback)
        with self._lock:
            self._listeners.setdefault(thread_id, []).append(item)

        def forget() -> None:
            with self._lock:
                found = self._listeners.get(thread_id)
                if found is not None and item in found:
                    found.remove(item)
                    if not found:
                        del self._listeners[thread_id]

        return forget

    def wake(
        self, thread_id: str, last_sequence: int, entries: Sequence[JournalEvent] = ()
    ) -> None:
        """Wake this loop's waiters of ``thread_id``: its journal now ends at ``last_sequence``
        (``entries``: what was appended, for the :meth:`listen` callbacks)."""
        if thread_id not in self._waiters and thread_id not in self._listeners:
            return  # the common case, read without the lock
        with self._lock:
            waiters = list(self._waiters.get(thread_id, ()))
            listeners = list(self._listeners.get(thread_id, ()))
        token = anyio.lowlevel.current_token()
        for owner, callback in listeners:
            if owner == token:
                with contextlib.suppress(Exception):  # the append is durable: never fail it
                    callback(entries)
        for waiter in waiters:
            if waiter.token == token:
                waiter.last = max(waiter.last, last_sequence)
                waiter.event.set()


async def poll_for_events(
    store: ThreadStore,
    thread_id: str,
    after_sequence: int,
    timeout_s: float,
    *,
    watch: Callable[[str, anyio.Event], Callable[[], None]] | None = None,
    pauses: tuple[float, float] | None = None,
    read: Callable[[str], Awaitable[int]] | None = None,
) -> int:
    """Wait until the thread's ``last_sequence`` is above ``after_sequence`` or ``timeout_s``
    passed; return it.

    Woken at once by an append committed through ``store`` in this event loop
    (:meth:`ThreadStore.notify_appended`); otherwise the metadata is polled, with pauses
    growing from ``pauses[0]`` to ``[1]`` (default ``store.wait_poll_s``), for appends by
    other processes. A store that hears of other processes' appends passes ``watch``: it
    is given each waiter's event to set on such an append and returns how to forget it
    (PostgreSQL's ``LISTEN/NOTIFY``); its pauses are then only a recheck.

    ``read`` returns a thread's last sequence (default: ``store.get_thread``'s). A poll
    wakes at the next multiple of its pause (of the loop's clock), the same instant for
    every waiter at that pause, so that the polls of many waiters meet in one pass of the
    event loop, where a ``read`` that coalesces them (the kit's
    :class:`~roder_api.storekit.BlockingThreadStore`) answers them with one store call.
    """
    deadline = anyio.current_time() + max(0.0, timeout_s)
    pause, longest = pauses or store.wait_poll_s
    wakeups = store.append_wakeups
    while True:
        waiter = wakeups.add(thread_id)  # before the read: an append after it wakes us
        forget = watch(thread_id, waiter.event) if watch is not None else None
        try:
            if read is not None:
                last = await read(thread_id)
            else:
                last = (await store.get_thread(thread_id)).last_sequence
            now = anyio.current_time()
            left = deadline - now
            if last > after_sequence or left <= 0:
                return last
            wake_at = min((math.floor(now / pause) + 1) * pause, deadline)
            with anyio.CancelScope(deadline=wake_at):  # the same instant for all: they meet
                await waiter.event.wait()
            if waiter.last > after_sequence:
                return waiter.last
        finally:
            if forget is not None:
                forget()
            wakeups.discard(thread_id, waiter)
        pause = min(pause * 2, longest)


async def has_open_turn(store: ThreadStore, thread_id: str) -> bool:
    """Return True when the thread's journal holds a turn accepted or started and not ended.

    Pages back from the newest event (``store.pending_tail`` events a page) until it meets
    the opening of a turn that no later event ended (True) or the journal's start (False):
    a long turn is judged as surely as a short one.
    """
    ended: set[str] = set()
    before: int | None = None
    while True:
        page = await store.event_page(thread_id, before=before, limit=store.pending_tail)
        for entry in reversed(page.events):
            event = entry.event
            if isinstance(event, (TurnComplete, TurnAborted)):
                ended.add(event.turn_id)
            else:
                turn_id = _opened(event)
                if turn_id is not None and turn_id not in ended:
                    return True
        if page.next_before is None or not page.events:
            return False
        before = page.next_before


async def find_pending_input(store: ThreadStore, updated_after_ms: int, limit: int) -> list[str]:
    """Walk the listing down to ``updated_after_ms``; return the threads with an open turn
    (:func:`has_open_turn`: paged back until each thread's state is known)."""
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
                pending = await has_open_turn(store, metadata.thread_id)
            except ThreadNotFoundError:
                continue  # deleted meanwhile
            if pending:
                found.append(metadata.thread_id)
                if len(found) >= limit:
                    return found
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor
