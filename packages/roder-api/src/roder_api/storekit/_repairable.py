"""Stores that can check and repair their threads: what ``roder fsck`` works with.

A store that can find damage in what it holds (checksums, sequence gaps, an index that
disagrees with the data) and repair it without losing data implements
:class:`RepairableThreadStore` next to :class:`~roder_api.threads.ThreadStore`. ``roder
fsck`` checks every thread through these methods, repairs on ``--repair`` and rebuilds the
store's index on ``--reindex``; it never calls anything else of the store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class CheckReport(ABC):
    """What checking one thread found (returned by :meth:`RepairableThreadStore.check_thread`).

    ``to_json`` is printed by ``roder fsck --json``; it should hold ``thread_id`` and
    ``ok`` plus whatever says where the damage is.
    """

    __slots__ = ()

    thread_id: str

    @property
    @abstractmethod
    def ok(self) -> bool:
        """Return True when the thread's data is intact and its index agrees with it."""

    @property
    @abstractmethod
    def data_damaged(self) -> bool:
        """Return True when the thread's own records are damaged (not only its index)."""

    @abstractmethod
    def describe(self) -> str:
        """Return one line saying what is wrong (or ``ok``)."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """Return the check as plain JSON data."""


class RepairReport(ABC):
    """What repairing one thread did (returned by :meth:`RepairableThreadStore.repair_thread`).

    ``to_json`` should hold ``quarantine``: where the damaged data was moved (or None).
    """

    __slots__ = ()

    thread_id: str

    @property
    @abstractmethod
    def unrepaired_reason(self) -> str | None:
        """Return why damage was left in place (None: it was repaired)."""

    @property
    @abstractmethod
    def thread_removed(self) -> bool:
        """Return True when nothing of the thread was left to keep (it is gone from the store)."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """Return the repair as plain JSON data."""


class RepairableThreadStore(ABC):
    """A thread store that ``roder fsck`` can check, repair and reindex.

    Checking changes nothing (and works on a store that may only be read); repairing never
    deletes data: what is damaged is moved aside (a quarantine file, a table) and the rest
    kept. Implement it next to ``ThreadStore``:
    ``class MyStore(ThreadStore, RepairableThreadStore)``.
    """

    @abstractmethod
    async def journal_ids(self) -> list[str]:
        """Return the id of every thread stored, sorted, whether or not its index knows it."""

    @abstractmethod
    async def check_thread(self, thread_id: str) -> CheckReport:
        """Return what a full check of the thread finds; change nothing.

        Raise ``ThreadNotFoundError`` when it no longer exists.
        """

    @abstractmethod
    async def repair_thread(self, thread_id: str) -> RepairReport:
        """Repair the thread: move what is damaged aside, fix its index; delete nothing."""

    @abstractmethod
    async def reindex_thread(self, thread_id: str) -> bool:
        """Rebuild the thread's index entry from its data; return True when it is indexed."""

    @abstractmethod
    async def prune_index(self) -> int:
        """Remove index entries of threads that no longer exist; return how many."""
