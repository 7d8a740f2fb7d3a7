"""A child for the lease trials: a session holder that streams turns until it is stopped.

    python lease_child.py MODE SPEC_JSON THREAD_ID ACK_PATH

Opens a session on THREAD_ID in the store SPEC_JSON describes (``{"name", "backend",
"settings"}``), then runs turns forever and appends ``<sequence> <turn id>`` to ACK_PATH for
every event ``next_event()`` delivers (each one is persisted before it is delivered), with
one unbuffered ``write``. With MODE ``fork`` it first forks a background job — a child that
inherits every descriptor, execs nothing and sleeps — and prints ``ready <job pid>``;
otherwise ``ready 0``. When the session stops because its lease was lost it prints
``lost <message>`` and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import anyio
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _torture.stores import StoreSpec  # noqa: E402 - after the path setup
from roder_api import ExtensionRegistryBuilder  # noqa: E402
from roder_api.errors import RecorderError, StoppedError  # noqa: E402
from roder_api.events import TurnAborted, TurnComplete  # noqa: E402
from roder_api.testing import ScriptedEngine  # noqa: E402
from roder_runtime import Runtime, RuntimeConfig, UserInput  # noqa: E402


def say(line: str) -> None:
    """Print one line for the parent, at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def background_job() -> None:
    """Run as the forked job: outlive the parent, touch nothing, never return."""
    time.sleep(120)
    os._exit(0)


async def main(mode: str, spec_json: str, thread_id: str, ack_path: str) -> int:
    spec = StoreSpec(**orjson.loads(spec_json))
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(delta_delay=0.005))
    builder.thread_store_factory(spec.factory())
    ack = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    async with Runtime(builder.build(), RuntimeConfig(), name="lease-holder") as runtime:
        async with runtime.start_session(thread_id) as session:
            job = 0
            if mode == "fork":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                    job = os.fork()
                if job == 0:
                    background_job()
            say(f"ready {job}")
            number = 0
            try:
                while True:
                    number += 1
                    words = " ".join(f"w{number}.{i}" for i in range(30))
                    turn_id = await session.submit(UserInput(words))
                    while True:
                        entry = await session.next_event()
                        turn = getattr(entry.event, "turn_id", None) or "-"
                        os.write(ack, f"{entry.sequence} {turn}\n".encode())
                        event = entry.event
                        if isinstance(event, (TurnComplete, TurnAborted)):
                            if event.turn_id == turn_id:
                                break
            except (RecorderError, StoppedError) as exc:
                say("lost " + " ".join(str(exc).split()))
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:5]))
