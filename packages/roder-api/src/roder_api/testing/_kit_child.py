"""The child process of the store kit's cross-process checks.

``python -m roder_api.testing._kit_child MODE FACTORY_FILE THREAD_ID ARG`` unpickles the
store factory from ``FACTORY_FILE``, opens the store and runs ``MODE``:

- ``append TAG COUNT``: opens the store, prints ``ready`` and waits for a line on stdin
  (so that two children start appending together), then appends COUNT one-event batches to
  the thread, each conditionally on the last sequence it just read (again after a
  ``SequenceConflictError``), as fast as it can; prints ``landed EXPECTED SEQUENCE TEXT``
  for each that landed and ``conflicts N`` at the end;
- ``lease OWNER``: takes the thread's lease, prints ``held PID``, and holds it until stdin
  closes (or the process is killed); prints ``busy DESCRIPTION`` when it is refused.

Every line is flushed at once, so the parent sees what happened as it happens.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import anyio
import anyio.to_thread

from roder_api.errors import SequenceConflictError, ThreadBusyError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadStoreFactory
from roder_api.transcript import UserMessage


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _append(factory: ThreadStoreFactory, thread_id: str, tag: str, count: int) -> None:
    store = await factory.open()
    conflicts = 0
    try:
        _say("ready")
        await anyio.to_thread.run_sync(sys.stdin.readline)  # the parent's "go"
        for index in range(count):
            text = f"{tag}:{index}"
            while True:
                expected = (await store.get_thread(thread_id)).last_sequence
                try:
                    [entry] = await store.append_events(
                        thread_id,
                        [ItemCompleted("turn-1", UserMessage(text))],
                        expected_last_sequence=expected,
                    )
                except SequenceConflictError:
                    conflicts += 1
                    continue
                _say(f"landed {expected} {entry.sequence} {text}")
                break
    finally:
        await store.aclose()
    _say(f"conflicts {conflicts}")


async def _lease(factory: ThreadStoreFactory, thread_id: str, owner: str) -> None:
    store = await factory.open()
    try:
        async with store.lease(thread_id, owner=owner) as lease:
            _say(f"held {lease.holder.pid}")
            await anyio.to_thread.run_sync(sys.stdin.read)  # until the parent closes stdin
    except ThreadBusyError as exc:
        _say(f"busy {exc.holder.describe() if exc.holder else '?'}")
    finally:
        await store.aclose()


def main(argv: list[str]) -> None:
    """Run one mode of the child (see the module docstring)."""
    mode, factory_file, thread_id, *rest = argv
    factory = pickle.loads(Path(factory_file).read_bytes())
    if mode == "append":
        anyio.run(_append, factory, thread_id, rest[0], int(rest[1]))
    elif mode == "lease":
        anyio.run(_lease, factory, thread_id, rest[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
