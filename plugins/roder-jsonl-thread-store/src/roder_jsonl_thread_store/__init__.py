"""The default Roder thread store: one append-only JSONL journal file per thread."""

from __future__ import annotations

from roder_jsonl_thread_store._store import (
    DURABILITY_MODES,
    JsonlThreadStore,
    JsonlThreadStoreFactory,
    ThreadCheck,
    ThreadRepair,
)

__all__ = [
    "DURABILITY_MODES",
    "JsonlThreadStore",
    "JsonlThreadStoreFactory",
    "ThreadCheck",
    "ThreadRepair",
]
