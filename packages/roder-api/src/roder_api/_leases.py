"""Thread leases: who holds one (:class:`LeaseHolder`), the lease (:class:`ThreadLease`), a new
thread made under its lease (:class:`LeasedThread`, :func:`lease_then_create`), and the
in-process leases of a store that has no cross-process lock (:func:`process_lease`).

Part of the store contract (``roder_api._thread_contract`` re-exports the two records, and
``roder_api.threads`` is their public home).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from roder_api.errors import ThreadBusyError
from roder_api.events import Event, JournalEvent

if TYPE_CHECKING:
    from roder_api._thread_contract import ThreadMetadata, ThreadStore


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a thread's lease: the owner's name, its process id and host, and since when."""

    owner: str
    pid: int
    host: str
    since_ms: int

    @classmethod
    def current(cls, owner: str) -> LeaseHolder:
        """Return a holder for ``owner`` in this process, on this host, from now."""
        return cls(owner, os.getpid(), socket.gethostname(), int(time.time() * 1000))

    def describe(self) -> str:
        """Return the holder in words: owner, pid, host and since when (UTC)."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))
        return f"{self.owner} (pid {self.pid} on {self.host}, since {since})"


@dataclass(frozen=True, slots=True)
class ThreadLease:
    """The right, held by one session at a time, to run turns on a thread."""

    thread_id: str
    holder: LeaseHolder


@dataclass(frozen=True, slots=True)
class LeasedThread:
    """A thread just made under its lease (``ThreadStore.lease_new_thread``): the lease, and
    the thread's first events as journaled."""

    lease: ThreadLease
    entries: list[JournalEvent]


@asynccontextmanager
async def lease_then_create(
    store: ThreadStore, metadata: ThreadMetadata, events: Sequence[Event], owner: str
) -> AsyncIterator[LeasedThread]:
    """``ThreadStore.lease_new_thread``'s default: take the lease (``store.lease``), then
    create the thread with its first events (``create_thread_with_events``); the lease is
    released on the way out, or at once when the create fails."""
    async with store.lease(metadata.thread_id, owner=owner) as lease:
        entries = await store.create_thread_with_events(metadata, events)
        yield LeasedThread(lease, entries)


class _ProcessLeases:
    """The leases held in this process by stores that have no cross-process lease."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], LeaseHolder] = {}

    def acquire(self, scope: int, thread_id: str, holder: LeaseHolder) -> None:
        with self._lock:
            current = self._held.get((scope, thread_id))
            if current is not None:
                raise ThreadBusyError(thread_id, current)
            self._held[(scope, thread_id)] = holder

    def release(self, scope: int, thread_id: str) -> None:
        with self._lock:
            self._held.pop((scope, thread_id), None)


_PROCESS_LEASES = _ProcessLeases()


@asynccontextmanager
async def process_lease(scope: int, thread_id: str, owner: str) -> AsyncIterator[ThreadLease]:
    """Hold a thread's lease among the users of one store object (``scope``, its id):
    ``ThreadStore.lease``'s default. Raise ``ThreadBusyError`` naming the holder."""
    holder = LeaseHolder.current(owner)
    _PROCESS_LEASES.acquire(scope, thread_id, holder)
    try:
        yield ThreadLease(thread_id, holder)
    finally:
        _PROCESS_LEASES.release(scope, thread_id)
