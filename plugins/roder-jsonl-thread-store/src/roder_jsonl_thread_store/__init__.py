"""The default Roder thread store: one append-only JSONL journal file per thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name in ("ThreadCheck", "ThreadRepair"):
        from roder_jsonl_thread_store import _fsck

        return getattr(_fsck, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
