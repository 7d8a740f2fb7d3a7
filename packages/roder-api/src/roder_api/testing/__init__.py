"""Test helpers for Roder plugins: the scripted engine, the memory store and the kits.

``ScriptedEngine`` plays deterministic scripts; ``MemoryThreadStore`` is a complete store in
memory (subclass it to inject faults). The conformance kits (pytest) are imported
lazily so that importing this package does not need pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api._exports import lazy_exports
from roder_api.testing._memory import MemoryData, MemoryThreadStore, MemoryThreadStoreFactory
from roder_api.testing._scripted import (
    Delay,
    Hang,
    Raise,
    Script,
    ScriptedEngine,
    ScriptFunction,
    ScriptStep,
    default_compaction,
    default_reply,
    estimate_tokens,
    tool_call,
)

if TYPE_CHECKING:
    from roder_api.testing.conformance import InferenceEngineConformance, ThreadStoreConformance

_LAZY = {
    "InferenceEngineConformance": "roder_api.testing.conformance",
    "ThreadStoreConformance": "roder_api.testing.conformance",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "Delay",
    "Hang",
    "InferenceEngineConformance",
    "MemoryData",
    "MemoryThreadStore",
    "MemoryThreadStoreFactory",
    "Raise",
    "Script",
    "ScriptFunction",
    "ScriptStep",
    "ScriptedEngine",
    "ThreadStoreConformance",
    "default_compaction",
    "default_reply",
    "estimate_tokens",
    "tool_call",
]
