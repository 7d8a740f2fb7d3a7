"""Test helpers for Roder plugins: the scripted engine and the conformance kits.

``ScriptedEngine`` plays deterministic scripts. The conformance kits (pytest) are imported
lazily so that importing this package does not need pytest.
"""

from __future__ import annotations

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
)

__all__ = [
    "Delay",
    "Hang",
    "Raise",
    "Script",
    "ScriptFunction",
    "ScriptStep",
    "ScriptedEngine",
    "default_compaction",
    "default_reply",
    "estimate_tokens",
]
