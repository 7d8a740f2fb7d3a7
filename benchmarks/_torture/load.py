"""Load: many concurrent streams on one runtime with the JSONL store, for a bounded time.

Every stream is a thread with its own consumer. The engine stamps each delta it yields;
the consumer measures, for every event it receives, the time since the event was persisted
(``recorded_at_ms``, with sessions) and since the engine yielded the text (with or without
sessions), and checks that the events arrive in journal order with nothing missing: after
the run, each thread's journal must equal exactly what its consumer received, and every
turn's text must equal what the engine produced.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    Event,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    TokenUsage,
    Usage,
)

from .stats import median_p99
from .stores import StoreSpec


class StampingEngine(InferenceEngine):
    """Streams ``deltas`` numbered deltas per turn, remembering when each was yielded."""

    id = "stamping"
    capabilities = InferenceCapabilities(streaming=True)

    def __init__(self, deltas: int = 40, pause_s: float = 0.002) -> None:
        self.deltas = deltas
        self.pause_s = pause_s
        self.yielded_at: dict[str, float] = {}
        self.produced: dict[str, str] = {}

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield numbered deltas with short pauses, then usage and completion."""
        text = []
        for number in range(self.deltas):
            delta = f"<{ctx.turn_id}:{number}>"
            self.yielded_at[delta] = time.perf_counter()
            text.append(delta)
            self.produced[ctx.turn_id] = "".join(text)
            yield MessageDelta(delta)
            await anyio.sleep(self.pause_s)
        yield Usage(TokenUsage(10, self.deltas, 10 + self.deltas))
        yield Completed("stop")


@dataclass
class LoadResult:
    """What the load run measured."""

    mode: str
    sessions: int
    seconds: float
    durability: str
    events: int = 0
    deltas_produced: int = 0
    turns: int = 0
    persist_to_deliver_ms: list[float] = field(default_factory=list)
    yield_to_deliver_ms: list[float] = field(default_factory=list)
    lost: int = 0
    reordered: int = 0
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return the figures as JSON."""
        p2d = median_p99(self.persist_to_deliver_ms)
        y2d = median_p99(self.yield_to_deliver_ms)
        return {
            "mode": self.mode,
            "sessions": self.sessions,
            "seconds": round(self.seconds, 3),
            "durability": self.durability,
            "events_delivered": self.events,
            "events_per_s": round(self.events / self.seconds, 1) if self.seconds else None,
            "deltas_produced": self.deltas_produced,
            "deltas_per_s": round(self.deltas_produced / self.seconds, 1) if self.seconds else None,
            "turns": self.turns,
            "persist_to_deliver_ms_median": p2d[0],
            "persist_to_deliver_ms_p99": p2d[1],
            "yield_to_deliver_ms_median": y2d[0],
            "yield_to_deliver_ms_p99": y2d[1],
            "lost": self.lost,
            "reordered": self.reordered,
            "problems": self.problems[:20],
        }

    def summary(self) -> str:
        """Return a short text summary for the report."""
        data = self.to_json()

        def ms(key: str) -> str:
            value = data[key]
            return "-" if value is None else f"{value:.1f}"

        return (
            f"load ({self.mode}, jsonl {self.durability}): {self.sessions} concurrent streams "
            f"for {data['seconds']} s: {data['events_delivered']} events delivered "
            f"({data['events_per_s']}/s), {data['deltas_produced']} deltas produced "
            f"({data['deltas_per_s']}/s), {self.turns} turns; persist-to-deliver median "
            f"{ms('persist_to_deliver_ms_median')} ms, p99 {ms('persist_to_deliver_ms_p99')} ms; "
            f"yield-to-deliver median {ms('yield_to_deliver_ms_median')} ms, p99 "
            f"{ms('yield_to_deliver_ms_p99')} ms; lost {self.lost}, reordered {self.reordered}"
        )


async def run_load(
    base: Path,
    *,
    sessions: int = 100,
    seconds: float = 5.0,
    durability: str = "fsync",
    deltas: int = 40,
) -> LoadResult:
    """Run ``sessions`` concurrent streams for ``seconds`` on one runtime; return figures."""
    from roder_runtime import Runtime, RuntimeConfig

    engine = StampingEngine(deltas=deltas)
    spec = StoreSpec(f"jsonl-{durability}", "jsonl", {"path": str(base), "durability": durability})
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(spec.factory())
    use_sessions = hasattr(Runtime, "start_session")
    result = LoadResult("sessions" if use_sessions else "run_turn", sessions, 0.0, durability)
    received: dict[str, list[JournalEvent | Event]] = {}

    def observe(event: Event, now: float) -> None:
        if isinstance(event, AssistantContentDelta) and event.phase is ContentPhase.FINAL_ANSWER:
            # A delivered delta may hold several coalesced engine deltas: time the first.
            first = event.delta.split(">", 1)[0] + ">"
            sent = engine.yielded_at.get(first)
            if sent is not None:
                result.yield_to_deliver_ms.append((now - sent) * 1000)

    async with Runtime(builder.build(), RuntimeConfig(default_engine="stamping")) as runtime:
        thread_ids = [(await runtime.create_thread()).thread_id for _ in range(sessions)]
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()

        async def stream_with_session(thread_id: str) -> None:
            from roder_runtime import UserInput

            got: list[JournalEvent | Event] = received.setdefault(thread_id, [])
            async with await runtime.start_session(thread_id) as session:
                number = 0
                while time.perf_counter() < deadline:
                    number += 1
                    await session.submit(UserInput(f"turn {number}"))
                    while True:
                        entry = await session.next_event()
                        now = time.perf_counter()
                        result.persist_to_deliver_ms.append(
                            max(0.0, time.time() * 1000 - entry.recorded_at_ms)
                        )
                        observe(entry.event, now)
                        got.append(entry)
                        if isinstance(entry.event, (TurnComplete, TurnAborted)):
                            result.turns += 1
                            break

        async def stream_with_run_turn(thread_id: str) -> None:
            got = received.setdefault(thread_id, [])

            async def emit(events: Sequence[Event]) -> None:
                now = time.perf_counter()
                for event in events:
                    observe(event, now)
                    got.append(event)

            number = 0
            while time.perf_counter() < deadline:
                number += 1
                await runtime.run_turn(thread_id, f"turn {number}", emit=emit)
                result.turns += 1

        async with anyio.create_task_group() as tg:
            for thread_id in thread_ids:
                tg.start_soon(
                    stream_with_session if use_sessions else stream_with_run_turn, thread_id
                )
        result.seconds = time.perf_counter() - started
        store = await runtime.store()
        for thread_id in thread_ids:
            journal = await store.read_events(thread_id)
            got = received[thread_id]
            result.events += len(got)
            _compare(result, thread_id, journal, got)
        result.deltas_produced = len(engine.yielded_at)
        _check_texts(result, engine, received)
    return result


def _compare(
    result: LoadResult,
    thread_id: str,
    journal: list[JournalEvent],
    got: list[JournalEvent | Event],
) -> None:
    if got and isinstance(got[0], JournalEvent):
        sequences = [e.sequence for e in got if isinstance(e, JournalEvent)]
        if sequences != sorted(sequences) or len(set(sequences)) != len(sequences):
            result.reordered += 1
            result.problems.append(f"{thread_id}: delivered out of sequence order")
        if list(journal) != list(got):
            result.lost += 1
            result.problems.append(
                f"{thread_id}: journal ({len(journal)} events) differs from what was "
                f"delivered ({len(got)})"
            )
    else:
        events = [e.event for e in journal]
        # run_turn delivers every event after it is persisted: the journal must be the same.
        if events != list(got):
            result.lost += 1
            result.problems.append(f"{thread_id}: journal differs from what was delivered")


def _check_texts(
    result: LoadResult, engine: StampingEngine, received: dict[str, list[JournalEvent | Event]]
) -> None:
    delivered: dict[str, str] = {}
    for got in received.values():
        for entry in got:
            event = entry.event if isinstance(entry, JournalEvent) else entry
            if isinstance(event, AssistantContentDelta):
                delivered[event.turn_id] = delivered.get(event.turn_id, "") + event.delta
    for turn_id, text in engine.produced.items():
        if delivered.get(turn_id, "") != text:
            result.lost += 1
            result.problems.append(f"turn {turn_id}: delivered text differs from the engine's")
