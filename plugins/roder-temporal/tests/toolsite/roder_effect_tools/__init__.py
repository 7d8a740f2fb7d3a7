"""A test plugin: ``effect``, a non-idempotent tool that counts its runs in a file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from roder_api import hookimpl
from roder_api.tools import Tool, tool


@tool
def effect(label: str) -> str:
    """Append a line to $RODER_TEST_EFFECTS (one per run), then take $RODER_TEST_EFFECT_S s."""
    with open(os.environ["RODER_TEST_EFFECTS"], "a") as file:
        file.write(f"{label} {os.getpid()}\n")
    time.sleep(float(os.environ.get("RODER_TEST_EFFECT_S", "0")))
    return f"done {label}"


@hookimpl
def register_tools(register: Callable[[Tool], None]) -> None:
    """Register ``effect`` (not idempotent: a crash never runs it again)."""
    register(effect)
