"""Checking (and repairing) the threads of a store that can: what ``roder fsck`` runs.

Works with any :class:`roder_api.storekit.RepairableThreadStore` (the JSONL store) through
its public methods, every call bounded by the runtime's store deadline. Public through
:mod:`roder_runtime.threads`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from roder_api.errors import StoreError, ThreadNotFoundError
from roder_api.storekit import CheckReport, RepairableThreadStore
from roder_runtime.threads._thread_ops import Progress, store_call

if TYPE_CHECKING:  # only for annotations: the runtime does not import this module
    from roder_runtime._runtime import Runtime


@dataclass(frozen=True, slots=True)
class ThreadCheck:
    """What :func:`check_threads` found in one thread, and did about it.

    ``status`` is ``ok``, ``damaged`` (left so), ``repaired`` or ``reindexed`` (only its
    index row disagreed, and ``reindex`` rebuilt it); ``repair`` the store's repair report
    as JSON (or ``{"error": ...}``), None when none was tried.
    """

    check: CheckReport
    status: str
    repair: dict[str, Any] | None = None
    unrepaired: str | None = None
    """Why the store did not repair it (``RepairReport.unrepaired_reason``), or None."""

    def to_json(self) -> dict[str, Any]:
        """Return the check as ``roder fsck --json`` prints it."""
        report = self.check.to_json()
        report["repair"] = self.repair
        report["status"] = self.status
        return report


@dataclass
class StoreCheck:
    """What :func:`check_threads` found in the whole store."""

    threads: list[ThreadCheck] = field(default_factory=list)
    reindexed: int | None = None
    """How many threads the rebuilt index holds (None without ``reindex``)."""

    def count(self, status: str) -> int:
        """Return how many threads ended with ``status``."""
        return sum(1 for t in self.threads if t.status == status)


async def check_threads(
    runtime: Runtime,
    *,
    repair: bool = False,
    reindex: bool = False,
    on_progress: Progress | None = None,
    on_thread: Callable[[ThreadCheck], None] | None = None,
) -> StoreCheck:
    """Check every thread of the runtime's store; repair and reindex on request.

    ``repair`` moves a damaged tail aside (never deletes data); ``reindex`` rebuilds the
    listing index from the journals. ``on_thread`` is called with each thread's result as
    it is known, ``on_progress(done, total)`` as the work advances. Raise ``StoreError``
    when the store cannot be checked (it is not a ``RepairableThreadStore``).

    Writes outside a session: repairs take no lease, so run them while no session writes
    to the store (a repair of a journal being appended to may quarantine a good tail).
    """
    store = await runtime.store()
    if not isinstance(store, RepairableThreadStore):
        raise StoreError(
            f"roder fsck checks JSONL thread stores; the configured store "
            f"({runtime.thread_store_factory().describe()}) has no journals to check; "
            "use that backend's own tools"
        )
    repairable: RepairableThreadStore = store
    thread_ids = await store_call(runtime, "journal listing", repairable.journal_ids)
    result = StoreCheck()
    for done, thread_id in enumerate(thread_ids, start=1):
        try:
            checked = await _check_one(runtime, repairable, thread_id, repair, reindex)
        except ThreadNotFoundError:
            checked = None  # deleted while we looked
        if checked is not None:
            result.threads.append(checked)
            if on_thread is not None:
                on_thread(checked)
        if on_progress is not None:
            on_progress(done, len(thread_ids))
    if reindex:
        result.reindexed = 0
        for thread_id in thread_ids:
            journal = await runtime.journal(thread_id)
            reindex_one = functools.partial(repairable.reindex_thread, thread_id)
            result.reindexed += bool(await journal.bounded("reindex", reindex_one))
        await store_call(runtime, "index pruning", repairable.prune_index)
    return result


async def _check_one(
    runtime: Runtime, store: RepairableThreadStore, thread_id: str, repair: bool, reindex: bool
) -> ThreadCheck:
    journal = await runtime.journal(thread_id)
    check = await journal.bounded("check", lambda: store.check_thread(thread_id))
    status = "ok" if check.ok else "damaged"
    report: dict[str, Any] | None = None
    unrepaired: str | None = None
    if not check.ok and repair:
        try:
            repaired = await journal.bounded("repair", lambda: store.repair_thread(thread_id))
        except StoreError as exc:
            report = {"error": str(exc)}
        else:
            report = repaired.to_json()
            unrepaired = repaired.unrepaired_reason
            if unrepaired is None:
                after = None
                if not repaired.thread_removed:
                    after = await journal.bounded("check", lambda: store.check_thread(thread_id))
                if after is None or after.ok:
                    status = "repaired"
    if status == "damaged" and not check.data_damaged and reindex:
        status = "reindexed"  # only the index disagreed; rebuilt after the checks
    return ThreadCheck(check, status, report, unrepaired)
