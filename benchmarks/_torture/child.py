"""What a crash-trial child process does until it is killed.

Each child opens the store the way a user's process would, tells the parent it is ready,
then commits as fast as it can. After every commit returns it appends one acknowledgement
line to the ack file with a single unbuffered ``os.write``: a line in the ack file is a
commit the store promised to keep. The parent kills the child with SIGKILL at a random
moment and checks the store against the acknowledgements.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import anyio

from roder_api.events import Event, ItemCompleted, JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.transcript import ContextCompaction, UserMessage

from .jobs import Acks, ChildJob

WRITERS_PER_CHILD = 3
"""Concurrent writer tasks in one append child (they share threads, to exercise locking)."""


def batch_events(batch_id: str, size: int, rng: random.Random) -> tuple[list[Event], int]:
    """Return a batch whose events all carry ``batch_id``, their index and the batch size.

    The last event bills usage; now and then one item is a compaction boundary, so replay
    boundaries move while children are killed. Return the events and the billed tokens.
    """
    events: list[Event] = []
    padding = "x" * rng.choice((0, 16, 200, 2_000, 20_000))
    for index in range(size - 1):
        text = f"{batch_id}|{index}|{size}|{padding}"
        if rng.random() < 0.04:
            events.append(ItemCompleted(batch_id, ContextCompaction(text)))
        else:
            events.append(ItemCompleted(batch_id, UserMessage(text)))
    tokens = rng.randint(1, 50)
    events.append(UsageUpdated(batch_id, TokenUsage(tokens, 1, tokens + 1), "turn"))
    return events, tokens


async def _append_child(job: ChildJob, conn: Connection) -> None:
    store = await job.spec.factory().open()
    acks = Acks(job.ack_path)
    conn.send("ready")

    async def writer(number: int) -> None:
        rng = random.Random(job.seed * 1_000 + number)
        count = 0
        while True:
            count += 1
            thread_id = rng.choice(job.thread_ids)
            batch_id = f"b{job.seed}.{number}.{count}"
            events, tokens = batch_events(batch_id, rng.randint(1, 6), rng)
            entries = await store.append_events(thread_id, events)
            acks.write(
                {"t": thread_id, "b": batch_id, "s": entries[0].sequence, "n": len(events)}
                | {"u": tokens}
            )

    async with anyio.create_task_group() as tg:
        for number in range(WRITERS_PER_CHILD):
            tg.start_soon(writer, number)


async def _turn_child(job: ChildJob, conn: Connection) -> None:
    from roder_api.extension import ExtensionRegistryBuilder
    from roder_api.testing import ScriptedEngine
    from roder_runtime import Runtime, RuntimeConfig

    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(job.spec.factory())
    rng = random.Random(job.seed)
    acks = Acks(job.ack_path)
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        await runtime.store()
        conn.send("ready")
        count = 0
        while True:
            count += 1
            thread_id = rng.choice(job.thread_ids)
            words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(1, 40)))
            text = f"q{job.seed}.{count} {words}"

            async def emit(events: Sequence[Event], thread_id: str = thread_id) -> None:
                turn_id = getattr(events[0], "turn_id", None)
                acks.write(
                    {"t": thread_id, "turn": turn_id, "types": [type(e).__name__ for e in events]}
                )

            await runtime.run_turn(thread_id, text, emit=emit)


async def _session_child(job: ChildJob, conn: Connection) -> None:
    from .sessions import session_child

    await session_child(job, conn)


async def _compact_child(job: ChildJob, conn: Connection) -> None:
    from .sessions import compact_child

    await compact_child(job, conn)


async def _inturn_child(job: ChildJob, conn: Connection) -> None:
    from .inturn import inturn_child

    await inturn_child(job, conn)


CHILD_MODES = {
    "append": _append_child,
    "turn": _turn_child,
    "session": _session_child,
    "compact": _compact_child,
    "inturn": _inturn_child,
}


class _AckLogHandler(logging.Handler):
    """Acknowledges the store's warnings (torn tails cut on recovery) so the parent counts."""

    def __init__(self, acks: Acks) -> None:
        super().__init__(logging.WARNING)
        self.acks = acks

    def emit(self, record: logging.LogRecord) -> None:
        self.acks.write({"log": record.getMessage()})


def child_entry(job: ChildJob, conn: Connection) -> None:
    """Run a crash-trial child until it is killed (the multiprocessing target)."""
    logger = logging.getLogger("roder")
    logger.addHandler(_AckLogHandler(Acks(job.ack_path)))
    logger.propagate = False
    anyio.run(CHILD_MODES[job.mode], job, conn, backend=job.backend)


def journal_event_ack(thread_id: str, entry: JournalEvent) -> dict[str, Any]:
    """Return the ack line for one delivered journal event."""
    return {"t": thread_id, "s": entry.sequence, "type": type(entry.event).__name__}
