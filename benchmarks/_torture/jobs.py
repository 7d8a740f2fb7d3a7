"""What a crash-trial child is given (:class:`ChildJob`) and how it acknowledges a commit
(:class:`Acks`): shared by ``child`` and the modes it runs (``sessions``, ``inturn``), and
by ``crash``, which starts the children.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import orjson

from .stores import StoreSpec


@dataclass(frozen=True)
class ChildJob:
    """Everything a child needs: what to do, on which store and threads, where to ack."""

    mode: str
    spec: StoreSpec
    thread_ids: tuple[str, ...]
    ack_path: str
    seed: int
    backend: str = "asyncio"


class Acks:
    """Appends acknowledgement lines to the ack file, one ``os.write`` each."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Acknowledge one commit (the line is in the kernel once this returns)."""
        os.write(self.fd, orjson.dumps(record) + b"\n")
