"""The shape of the write path: encodings per event, syncs per tool turn, store threads.

One session turn with one tool call on the JSONL store (``group`` durability), counted:

- encodings: calls of the codec's ``to_dict`` on an event (every ``dumps``, ``dumps_each``
  and ``dumps_list`` of an event starts with one), divided by the events journaled;
- syncs: the journal's ``fdatasync`` calls (the store's own, so the index's SQLite syncs
  are not counted) during the turn;
- threads: the names of the threads alive under the store path after the turn.

``strace -f -e trace=fdatasync,fsync`` on this script shows the same syncs from outside.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import orjson

import roder_api.codec as codec
import roder_jsonl_thread_store._writer as jsonl_writer
from roder_api import ExtensionRegistryBuilder
from roder_api.events import Event
from roder_api.testing import ScriptedEngine
from roder_api.tools import tool
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def _thread_kinds() -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for thread in threading.enumerate():
        if thread is threading.main_thread():
            continue
        name = thread.name.rstrip("0123456789_-")
        kinds[name.split("(")[0].strip()] += 1
    return dict(kinds)


def _batches(journal: Path) -> list[str]:
    """Return each events line of a journal as its event types (one line: one commit)."""
    out = []
    for line in journal.read_bytes().splitlines():
        record = orjson.loads(line)["r"]
        if record.get("k") == "events":
            out.append("+".join(e.get("type", "?") for e in record["events"]))
    return out


async def measure(base: Path) -> dict[str, Any]:
    """Return the counts of one tool turn on a fresh JSONL store under ``base``."""
    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine()).tool(add)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base / "threads"))
    runtime = Runtime(builder.build(), RuntimeConfig())
    encodes = 0
    syncs = 0
    original_to_dict = codec.to_dict
    original_sync = jsonl_writer.datasync

    def counting_to_dict(obj: Any) -> Any:
        nonlocal encodes
        if isinstance(obj, Event):
            encodes += 1
        return original_to_dict(obj)

    def counting_sync(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        original_sync(fd)

    try:
        thread_id = (await runtime.create_thread()).thread_id
        codec.to_dict = counting_to_dict  # type: ignore[assignment]
        jsonl_writer.datasync = counting_sync
        try:
            reply = await runtime.run_turn(thread_id, 'call add {"a": 2, "b": 3}', tools=["add"])
        finally:
            codec.to_dict = original_to_dict
            jsonl_writer.datasync = original_sync
        page = await runtime.event_page(thread_id, limit=1000)
        batches = _batches(base / "threads" / "threads" / f"{thread_id}.jsonl")
        events = len(page.events)
        threads = _thread_kinds()
    finally:
        await runtime.aclose()
    return {
        "reply": reply,
        "events": events,
        "encodes": encodes,
        "encodes_per_event": round(encodes / events, 2),
        "journal_syncs": syncs,
        "threads": threads,
        "batches": batches,
    }


def main() -> None:
    """Print the counts of one tool turn (``--json PATH`` also writes them)."""
    parser = argparse.ArgumentParser(description=__doc__)
    # One turn is already quick: --quick is accepted so that scripts/smoke can run it.
    parser.add_argument("--quick", action="store_true", help="the same single turn")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = anyio.run(measure, Path(tmp))
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
