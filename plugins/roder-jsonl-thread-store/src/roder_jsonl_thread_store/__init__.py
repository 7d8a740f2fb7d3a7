"""The default Roder thread store: one append-only JSONL journal file per thread."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api import lazy_exports
from roder_jsonl_thread_store._store import (
    DURABILITY_MODES,
    JsonlThreadStore,
    JsonlThreadStoreFactory,
)

if TYPE_CHECKING:  # fsck's results, imported on first use (PEP 562 below)
    from roder_jsonl_thread_store._fsck import ThreadCheck, ThreadRepair

__all__ = [
    "DURABILITY_MODES",
    "JsonlThreadStore",
    "JsonlThreadStoreFactory",
    "ThreadCheck",
    "ThreadRepair",
]


__getattr__, __dir__ = lazy_exports(
    __name__,
    {name: "roder_jsonl_thread_store._fsck" for name in ("ThreadCheck", "ThreadRepair")},
)
