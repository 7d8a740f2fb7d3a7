"""A process that holds a session on a thread until told: what another process must respect.

Usage: ``python _lease_child.py KIND WHERE THREAD_ID``; KIND is jsonl (WHERE a directory),
sqlite (a file) or postgres (``DSN#SCHEMA``). Prints ``holding`` once the session is open
(or ``busy: <message>`` and exits 3), then per stdin line ``turn TEXT`` runs a turn and
prints ``done TEXT``; at the end of input closes the session and prints ``closed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import ThreadBusyError
from roder_api.events import TurnAborted, TurnComplete
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadStoreFactory
from roder_runtime import Runtime, UserInput


def factory(kind: str, where: str) -> ThreadStoreFactory:
    """Return the store factory of ``kind`` at ``where``."""
    if kind == "jsonl":
        from roder_jsonl_thread_store import JsonlThreadStoreFactory

        return JsonlThreadStoreFactory(base_path=Path(where))
    if kind == "sqlite":
        from roder_sqlite_thread_store import SqliteThreadStoreFactory

        return SqliteThreadStoreFactory(Path(where))
    from roder_postgres_thread_store import PostgresThreadStoreFactory

    dsn, schema = where.rsplit("#", 1)
    return PostgresThreadStoreFactory(dsn, schema=schema)


def fork_background_job() -> int:
    """Fork a child that outlives its parent, touching nothing (as a tool's background job
    would, without exec); return its pid once it runs.

    The child lets go of what it must not keep (``storekit.close_on_fork``) in its at-fork
    handler, which runs when the child is first scheduled: until then its copies of the
    descriptors still hold their locks (milliseconds; longer on a loaded machine). So the
    parent waits for the child's first byte before it reports the fork done.
    """
    import os
    import time
    import warnings

    ready, tell = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:
        os.close(ready)
        os.write(tell, b"x")
        os.close(tell)
        time.sleep(120)
        os._exit(0)
    os.close(tell)
    try:
        if os.read(ready, 1) != b"x":
            raise RuntimeError("the forked child died before it ran")
    finally:
        os.close(ready)
    return pid


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(kind: str, where: str, thread_id: str) -> int:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory(kind, where))
    async with Runtime(builder.build(), name="lease-child") as runtime:
        try:
            session = await runtime.start_session(thread_id)
        except ThreadBusyError as exc:
            say(f"busy: {exc}")
            return 3
        async with session:
            say("holding")
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    break
                text = line.strip().removeprefix("turn ")
                turn_id = await session.submit(UserInput(text))
                while True:
                    event = (await session.next_event()).event
                    if isinstance(event, (TurnComplete, TurnAborted)) and event.turn_id == turn_id:
                        break
                say(f"done {text}")
    say("closed")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:4]))
