"""Ids for turns, steps and compactions, and closing an engine's stream."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import anyio


def new_id(prefix: str) -> str:
    """Return a fresh id such as ``turn_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


async def close_stream(stream: AsyncIterator[object]) -> None:
    """Close an engine's stream at once (shielded, so it also runs while cancelling)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()
