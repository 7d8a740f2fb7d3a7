"""Helpers shared by the JSONL store's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory


def msg(i: int, size: int = 0) -> ItemCompleted:
    """Return a user-message event ``message <i>``, padded with ``size`` dots."""
    return ItemCompleted("turn", UserMessage(f"message {i}" + "." * size))


async def journal_with(factory: JsonlThreadStoreFactory, thread_id: str, count: int) -> Path:
    """Create a thread with ``count`` single-event batches; return its journal's path."""
    store = await factory.open()
    await store.create_thread(ThreadMetadata(thread_id, 1000, 1000))
    for i in range(count):
        await store.append_events(thread_id, [msg(i)])
    path = store.journal_path(thread_id)
    await store.aclose()
    return path


def start_script(source: str, *args: str, ready: str) -> subprocess.Popen[str]:
    """Start ``python -c source args...`` with piped stdin and stdout; return it once its
    first line is ``ready``."""
    child = subprocess.Popen(
        [sys.executable, "-c", source, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == ready
    return child
