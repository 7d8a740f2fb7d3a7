"""Wake-ups by ``LISTEN/NOTIFY``: what ``PostgresThreadStore.wait_for_events`` waits on.

Every append sends ``pg_notify(channel, thread_id)`` inside its transaction (delivered at
commit, to every listener on every machine). One listening connection per store object,
in a thread of its own, wakes the tasks that wait on that thread id. A waiter registers
before it reads the last sequence, so a commit between the read and the wait is not
missed; it also reads again every :data:`RECHECK_S` (a notification lost while the
listening connection reconnects costs at most that).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import psycopg
from psycopg import sql

RECHECK_S = 1.0
"""The longest a waiter goes without reading the last sequence itself."""


def channel_name(schema: str) -> str:
    """Return the notification channel of a schema (an identifier of at most 63 bytes)."""
    name = f"roder_events_{schema}"
    if len(name) <= 63:
        return name
    return "roder_events_" + hashlib.sha256(schema.encode()).hexdigest()[:40]


class EventNotifier:
    """Listens on a channel in a daemon thread; wakes the waiters of a thread id."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str) -> None:
        self._connect = connect
        self._channel = channel
        self._lock = threading.Lock()
        self._waiters: dict[str, list[tuple[anyio.Event, Any]]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start listening (once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name=f"roder-{self._channel}", daemon=True
                )
                self._thread.start()

    def add(self, thread_id: str, event: anyio.Event) -> None:
        """Set ``event`` (in its event loop) at the next notification for ``thread_id``."""
        token = anyio.lowlevel.current_token()
        with self._lock:
            self._waiters.setdefault(thread_id, []).append((event, token))

    def discard(self, thread_id: str, event: anyio.Event) -> None:
        """Forget a waiter."""
        with self._lock:
            waiters = self._waiters.get(thread_id, [])
            self._waiters[thread_id] = [w for w in waiters if w[0] is not event]
            if not self._waiters[thread_id]:
                del self._waiters[thread_id]

    def close(self) -> None:
        """Stop listening (blocking: waits for the thread, about a second at most)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._wake_all()  # anything committed while not listening
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._wake(note.payload)
            except psycopg.Error:
                self._stop.wait(RECHECK_S)  # the server went away: listen again soon

    def _wake(self, thread_id: str) -> None:
        with self._lock:
            waiters = self._waiters.pop(thread_id, [])
        for event, token in waiters:
            try:
                anyio.from_thread.run_sync(event.set, token=token)
            except Exception:  # noqa: BLE001 - that loop is gone: nobody to wake
                pass

    def _wake_all(self) -> None:
        with self._lock:
            ids = list(self._waiters)
        for thread_id in ids:
            self._wake(thread_id)
