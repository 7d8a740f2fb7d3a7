"""A writer that forks background jobs while its appends are committed, then waits.

Usage: ``python _fork_appender_child.py KIND WHERE THREAD_ID FORKS``. Keeps four tasks
appending to the thread (so that a commit, with whatever it locks, is nearly always under
way on the store's worker thread) and forks FORKS children from the event loop meanwhile,
each a background job that inherits every descriptor and execs nothing. Prints
``forked PID PID ...`` and sleeps until killed.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import anyio

from roder_api import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.transcript import UserMessage
from roder_runtime import Runtime

sys.path.insert(0, os.path.dirname(__file__))
from _lease_child import factory, say  # noqa: E402


def background_job() -> None:
    """Run as a forked child: outlive the parent, touch nothing, never return."""
    time.sleep(120)
    os._exit(0)


async def main(kind: str, where: str, thread_id: str, forks: str) -> int:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory(kind, where))
    children: list[int] = []
    async with Runtime(builder.build(), name="fork-appender") as runtime:

        async def append(n: int) -> None:
            for i in range(10_000):
                await runtime.persist_turn_item(thread_id, "turn-1", UserMessage(f"{n}-{i}"))

        async with anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(append, n)
            await anyio.sleep(0.2)
            for _ in range(int(forks)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                    pid = os.fork()
                if pid == 0:
                    background_job()
                children.append(pid)
                await anyio.sleep(0.01)
            say("forked " + " ".join(map(str, children)))
            await anyio.sleep_forever()
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:5]))
