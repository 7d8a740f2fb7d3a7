"""Operations on threads outside a session: fork, export, prune, migrate, check.

Each takes a :class:`~roder_runtime.Runtime` (``migrate`` two store factories) and reaches
the store only through it, every store call bounded by the runtime's store deadline
(``turn_timeout_s``, two minutes when unset): a store that stops answering fails the
operation with a ``StoreError`` naming the store instead of hanging it. ``roder threads``
and ``roder migrate`` are thin commands over these functions::

    async with await Runtime.open() as runtime:
        fork = await threads.fork_thread(runtime, thread_id, at=4)
        text = (await threads.export_thread(runtime, fork.thread.thread_id, "markdown")).text

None of them takes a thread's lease except deletes (``Runtime.delete_thread``, and
:func:`prune_threads` through it), which refuse a thread a session holds with
``ThreadBusyError`` naming the holder. Each function's docstring says what else excludes
a racing writer.

May import: store, _runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api import lazy_exports

if TYPE_CHECKING:
    from roder_runtime.threads._export import ExportFormat, ThreadExport, export_thread
    from roder_runtime.threads._fsck_ops import StoreCheck, ThreadCheck, check_threads
    from roder_runtime.threads._migration import MigrationReport, ThreadResult, migrate
    from roder_runtime.threads._thread_ops import (
        ForkResult,
        Progress,
        PrunableThread,
        PrunePlan,
        PruneResult,
        all_threads,
        fork_thread,
        plan_prune,
        prune_threads,
        read_journal,
    )

__all__ = [
    "ExportFormat",
    "ForkResult",
    "MigrationReport",
    "Progress",
    "PrunableThread",
    "PrunePlan",
    "PruneResult",
    "StoreCheck",
    "ThreadCheck",
    "ThreadExport",
    "ThreadResult",
    "all_threads",
    "check_threads",
    "export_thread",
    "fork_thread",
    "migrate",
    "plan_prune",
    "prune_threads",
    "read_journal",
]

_HOMES = {
    "_export": ("ExportFormat", "ThreadExport", "export_thread"),
    "_fsck_ops": ("StoreCheck", "ThreadCheck", "check_threads"),
    "_migration": ("MigrationReport", "ThreadResult", "migrate"),
    "_thread_ops": (
        "ForkResult",
        "Progress",
        "PrunableThread",
        "PrunePlan",
        "PruneResult",
        "all_threads",
        "fork_thread",
        "plan_prune",
        "prune_threads",
        "read_journal",
    ),
}
_LAZY = {name: f"{__name__}.{module}" for module, names in _HOMES.items() for name in names}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
