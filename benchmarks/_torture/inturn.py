"""Crash trials of in-turn native compaction: sessions whose model steps stream a boundary.

``inturn_child`` chats through sessions with a scripted engine whose ``stream_turn`` streams
a compaction boundary before its reply in most steps, then completes (the boundary commits
with the step), breaks off, fails, or streams a second, different boundary (each of those
discards it). Every delivered event is acknowledged by its sequence; a delivered boundary
is flagged. The checks: a journaled boundary is always followed, in the same batch, by its
``CompactionCommitted`` and the rest of its step up to the turn's end (never half a commit);
no commit without its boundary; no turn both discards and commits; every acknowledged
boundary is where it was delivered.
"""

from __future__ import annotations

import random
from multiprocessing.connection import Connection
from typing import Any

from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import (
    AgentInferenceRequest,
    Failed,
    InferenceTurnContext,
    ProviderFailure,
    ProviderFailureKind,
)
from roder_api.testing import Delay, Raise, ScriptedEngine, ScriptStep
from roder_api.testing._scripted import default_reply
from roder_api.threads import ThreadMetadata
from roder_api.transcript import ProviderMetadata, is_compaction_boundary

from .checks import ThreadState, register_checker
from .jobs import Acks, ChildJob
from .stats import KindStats


def _boundary(name: str) -> ProviderMetadata:
    item = {"type": "compaction", "id": f"cmp_{name}", "encrypted_content": f"state:{name}"}
    return ProviderMetadata({"provider": "torture", "output": [item], "compacted_input": [item]})


def _steps(rng: random.Random) -> Any:
    def script(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        reply = default_reply(request)
        boundary = _boundary(f"{ctx.model_step_id}")
        pause = Delay(rng.uniform(0, 0.004))  # widen the window between staging and commit
        roll = rng.random()
        if roll < 0.55:
            return [boundary, pause, *reply]  # completes: commits with the step
        half = reply[: max(1, len(reply) // 2)]
        if roll < 0.7:
            cut = ProviderFailure(ProviderFailureKind.STREAM_INTERRUPTED, "cut")
            return [boundary, *half, pause, Raise(cut)]  # disconnected
        if roll < 0.8:
            return [boundary, *half, pause, Failed("the provider gave up")]  # failed
        if roll < 0.9:
            # Two different boundaries: discarded, the reply itself is kept.
            return [boundary, _boundary(f"{ctx.model_step_id}-other"), pause, *reply]
        return list(reply)  # no compaction at all

    return script


async def inturn_child(job: ChildJob, conn: Connection) -> None:
    """Chat through sessions whose steps compact in-turn, acknowledging delivered events."""
    from roder_runtime import Runtime, RuntimeConfig, UserInput

    rng = random.Random(job.seed)
    acks = Acks(job.ack_path)
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(turns=_steps(rng)))
    builder.thread_store_factory(job.spec.factory())
    config = RuntimeConfig()
    config.reliability.provider_retry_initial_backoff_ms = 0
    async with Runtime(builder.build(), config) as runtime:
        await runtime.store()
        conn.send("ready")
        count = 0
        while True:
            thread_id = rng.choice(job.thread_ids)
            async with await runtime.start_session(thread_id) as session:
                for _ in range(rng.randint(1, 3)):
                    count += 1
                    words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(1, 30)))
                    turn_id = await session.submit(UserInput(f"q{job.seed}.{count} {words}"))
                    while True:
                        entry: JournalEvent = await session.next_event()
                        event = entry.event
                        ack: dict[str, Any] = {
                            "t": thread_id,
                            "s": entry.sequence,
                            "type": type(event).__name__,
                        }
                        if isinstance(event, ItemCompleted) and is_compaction_boundary(event.item):
                            ack["boundary"] = True
                        acks.write(ack)
                        if (
                            isinstance(event, (TurnComplete, TurnAborted))
                            and event.turn_id == turn_id
                        ):
                            break


def check_inturn_commits(
    stats: KindStats,
    thread_id: str,
    state: ThreadState,
    metadata: ThreadMetadata,
    events: list[JournalEvent],
) -> None:
    """Check every in-turn boundary was committed whole, with its step, or not at all."""
    where = f"{stats.kind} thread {thread_id}"
    committed: set[str] = set()
    discarded: set[str] = set()
    for index, entry in enumerate(events):
        event = entry.event
        if isinstance(event, CompactionDiscarded) and event.turn_id:
            discarded.add(event.turn_id)
        if isinstance(event, CompactionCommitted):
            before = events[index - 1].event if index else None
            if not (isinstance(before, ItemCompleted) and is_compaction_boundary(before.item)):
                stats.problem(f"{where}: commit at {entry.sequence} without a boundary", corrupt=1)
        if not (isinstance(event, ItemCompleted) and is_compaction_boundary(event.item)):
            continue
        turn_id = event.turn_id
        committed.add(turn_id)
        rest = [e.event for e in events[index + 1 :]]
        if not rest or not isinstance(rest[0], CompactionCommitted):
            stats.problem(
                f"{where}: boundary at {entry.sequence} without its commit (half a commit)",
                corrupt=1,
            )
            continue
        # The step's items follow, then the turn's end: all in the same append.
        for later in rest[1:]:
            if isinstance(later, TurnComplete) and later.turn_id == turn_id:
                break
            if not (isinstance(later, ItemCompleted) and later.turn_id == turn_id):
                stats.problem(
                    f"{where}: boundary at {entry.sequence} committed without its whole step "
                    f"(then {type(later).__name__})",
                    corrupt=1,
                )
                break
        else:
            stats.problem(
                f"{where}: boundary at {entry.sequence} committed without its step's end",
                corrupt=1,
            )
    for turn_id in sorted(committed & discarded):
        stats.problem(f"{where}: turn {turn_id} both committed and discarded", corrupt=1)
    for sequence in state.acked_boundaries:
        found = events[sequence - 1].event if sequence <= len(events) else None
        if not (isinstance(found, ItemCompleted) and is_compaction_boundary(found.item)):
            stats.problem(f"{where}: delivered boundary {sequence} is missing", lost=1)


register_checker("inturn", check_inturn_commits)
