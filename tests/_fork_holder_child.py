"""A session holder that forks a background job (as a tool's job would), then waits.

Usage: ``python _fork_holder_child.py KIND WHERE THREAD_ID``. Opens a session on the
thread, forks a child that keeps running (it inherits every descriptor the holder has and
execs nothing), prints ``holding HOLDER_PID CHILD_PID`` and sleeps until killed.
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
    """Run as the forked child: outlive the parent, touch nothing, never return."""
    time.sleep(120)
    os._exit(0)


async def main(kind: str, where: str, thread_id: str) -> int:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory(kind, where))
    async with Runtime(builder.build(), name="fork-holder") as runtime:
        # A write first: a store that writes may hold more than the lease (the JSONL
        # store's liveness marker), and a forked child must not keep any of it.
        await runtime.persist_turn_item(thread_id, "turn-0", UserMessage("before the fork"))
        async with runtime.start_session(thread_id):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:
                background_job()
            say(f"holding {os.getpid()} {pid}")
            await anyio.sleep_forever()
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:4]))
