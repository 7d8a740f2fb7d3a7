"""Crash-trial children that stream sessions and compact, and the checks for them.

``session_child`` chats through ``Runtime.start_session`` and acknowledges every event it
receives from ``next_event()`` (events are persisted before they are delivered, so each
one acknowledged must be in the journal at its sequence). ``compact_child`` alternates turns
and ``Runtime.compact_with_provider`` (some compactions fail on purpose) and acknowledges
each committed boundary by its sequence.
"""

from __future__ import annotations

import random
from multiprocessing.connection import Connection
from typing import Any

from roder_api.events import (
    CompactionCommitted,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import (
    AgentInferenceRequest,
    Failed,
    InferenceTurnContext,
    ProviderFailure,
    ProviderFailureKind,
)
from roder_api.testing import Delay, Raise, ScriptedEngine, ScriptStep, default_compaction
from roder_api.threads import ThreadMetadata
from roder_api.transcript import is_compaction_boundary

from .child import Acks, ChildJob
from .crash import ThreadState, register_checker
from .stats import KindStats


def _runtime(job: ChildJob, engine: ScriptedEngine) -> Any:
    from roder_runtime import Runtime, RuntimeConfig

    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(job.spec.factory())
    config = RuntimeConfig()
    config.reliability.provider_retry_initial_backoff_ms = 0
    return Runtime(builder.build(), config)


def _text(rng: random.Random, job: ChildJob, count: int) -> str:
    words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(1, 40)))
    return f"q{job.seed}.{count} {words}"


async def session_child(job: ChildJob, conn: Connection) -> None:
    """Chat through sessions until killed, acknowledging every delivered event."""
    from roder_runtime import UserInput

    rng = random.Random(job.seed)
    acks = Acks(job.ack_path)
    async with _runtime(job, ScriptedEngine()) as runtime:
        await runtime.store()
        conn.send("ready")
        count = 0
        while True:
            thread_id = rng.choice(job.thread_ids)
            async with await runtime.start_session(thread_id) as session:
                for _ in range(rng.randint(1, 3)):
                    count += 1
                    turn_id = await session.submit(UserInput(_text(rng, job, count)))
                    while True:
                        entry: JournalEvent = await session.next_event()
                        event = entry.event
                        acks.write(
                            {
                                "t": thread_id,
                                "s": entry.sequence,
                                "type": type(event).__name__,
                                "turn": getattr(event, "turn_id", None),
                            }
                        )
                        if (
                            isinstance(event, (TurnComplete, TurnAborted))
                            and event.turn_id == turn_id
                        ):
                            break


def _compactions(rng: random.Random) -> Any:
    def script(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        steps = default_compaction(request, index)
        roll = rng.random()
        if roll < 0.15:
            # No boundary, a failed stream: the candidate is discarded, usage still billed.
            return [steps[1], Failed("the provider gave up")]
        if roll < 0.25:
            return [
                steps[1],
                Raise(ProviderFailure(ProviderFailureKind.INVALID_REQUEST, "refused")),
            ]
        # Widen the window between staging the boundary and committing it.
        return [steps[0], Delay(rng.uniform(0, 0.004)), *steps[1:]]

    return script


async def compact_child(job: ChildJob, conn: Connection) -> None:
    """Alternate turns and compactions until killed; acknowledge committed boundaries."""
    from roder_api.errors import CompactionError
    from roder_runtime.model._ids import new_id

    rng = random.Random(job.seed)
    acks = Acks(job.ack_path)
    engine = ScriptedEngine(compactions=_compactions(rng))
    async with _runtime(job, engine) as runtime:
        await runtime.store()
        conn.send("ready")
        count = 0
        while True:
            count += 1
            thread_id = rng.choice(job.thread_ids)

            async def emit(events: Any, thread_id: str = thread_id) -> None:
                turn_id = getattr(events[0], "turn_id", None)
                acks.write(
                    {"t": thread_id, "turn": turn_id, "types": [type(e).__name__ for e in events]}
                )

            await runtime.run_turn(thread_id, _text(rng, job, count), emit=emit)
            if rng.random() < 0.5:
                continue
            history = await runtime.replay_history(thread_id)
            turn_id = new_id("compaction")
            try:
                await runtime.compact_with_provider(thread_id, turn_id, None, None, history)
            except CompactionError:
                acks.write({"t": thread_id, "discarded": turn_id})
                continue
            metadata: ThreadMetadata = await runtime.get_thread(thread_id)
            # One writer per thread here: the commit is the journal's last three events.
            acks.write(
                {
                    "t": thread_id,
                    "s": metadata.last_sequence - 2,
                    "type": "ItemCompleted",
                    "boundary": True,
                    "turn": turn_id,
                }
            )


def check_compactions(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
) -> None:
    """Check each boundary was committed whole and every acknowledged one is in place."""
    where = f"{stats.kind} thread {thread_id}"
    for index, entry in enumerate(events):
        event = entry.event
        if isinstance(event, ItemCompleted) and is_compaction_boundary(event.item):
            rest = [e.event for e in events[index + 1 : index + 3]]
            if (
                len(rest) != 2
                or not isinstance(rest[0], UsageUpdated)
                or not isinstance(rest[1], CompactionCommitted)
            ):
                stats.problem(
                    f"{where}: boundary at {entry.sequence} without its usage and commit "
                    "(half a compaction commit)",
                    corrupt=1,
                )
        if isinstance(event, CompactionCommitted):
            before = events[index - 2].event if index >= 2 else None
            if not (isinstance(before, ItemCompleted) and is_compaction_boundary(before.item)):
                stats.problem(f"{where}: commit at {entry.sequence} without a boundary", corrupt=1)
    for sequence in state.acked_boundaries:
        entry_event = events[sequence - 1].event if sequence <= len(events) else None
        if not (
            isinstance(entry_event, ItemCompleted) and is_compaction_boundary(entry_event.item)
        ):
            stats.problem(f"{where}: acknowledged boundary {sequence} is missing", lost=1)


def check_session_turns(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
) -> None:
    """Check turns do not interleave and only the last one may be left open by a kill."""
    where = f"{stats.kind} thread {thread_id}"
    open_turn: str | None = None
    for entry in events:
        event = entry.event
        if isinstance(event, TurnStarted):
            if open_turn is not None:
                stats.problem(
                    f"{where}: turn {event.turn_id} started while {open_turn} was still "
                    "open (a dead process's turn was not closed)",
                    corrupt=1,
                )
            open_turn = event.turn_id
        elif isinstance(event, (TurnComplete, TurnAborted)):
            open_turn = None


register_checker("compact", check_compactions)
register_checker("session", check_session_turns)
