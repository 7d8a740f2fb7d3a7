"""An interrupt that arrives while a compaction's append is in flight (the store is slow to
return) ends the turn with ``TurnAborted`` and the session goes on; the JSONL journal never
holds a committed boundary followed by a tool call without a result."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import (
    AbortReason,
    CompactionCommitted,
    CompactionStarted,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.inference import Completed, TokenUsage, ToolCallCompleted, Usage
from roder_api.testing import ScriptedEngine, ScriptStep
from roder_api.tools import tool
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
)
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_runtime import Interrupt, Runtime, RuntimeConfig, UserInput

from .session_support import events_until

pytestmark = pytest.mark.anyio


@tool
def lookup(q: str) -> str:
    """Look ``q`` up."""
    return f"found {q}"


class SlowCommitFactory(JsonlThreadStoreFactory):
    """A real JSONL store whose appends of ``kind`` events take a while to return (a slow
    fsync): the batch is written, then the call waits; ``in_flight`` is set meanwhile."""

    def __init__(self, base: Path, kind: type[Event]) -> None:
        super().__init__(base_path=base)
        self.kind = kind
        self.in_flight = anyio.Event()

    async def open(self) -> JsonlThreadStore:
        store = await super().open()
        append = store.append_events

        async def slow(
            thread_id: str, events: Sequence[Event], **kwargs: Any
        ) -> list[JournalEvent]:
            entries = await append(thread_id, events, **kwargs)
            if any(isinstance(e, self.kind) for e in events):
                self.in_flight.set()
                await anyio.sleep(0.5)
            return entries

        store.append_events = slow  # type: ignore[method-assign]
        return store


def boundary() -> ProviderMetadata:
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "state"}
    return ProviderMetadata({"provider": "test", "output": [item], "compacted_input": [item]})


def runtime_on(factory: SlowCommitFactory, engine: ScriptedEngine, **compaction: Any) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.tool(lookup)
    builder.thread_store_factory(factory)
    config = RuntimeConfig()
    for key, value in compaction.items():
        setattr(config.compaction, key, value)
    return Runtime(builder.build(), config)


def calls_without_results(events: Sequence[Event]) -> list[str]:
    calls = [
        e.item.id
        for e in events
        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolCallRecord)
    ]
    results = {
        e.item.id
        for e in events
        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord)
    }
    return [c for c in calls if c not in results]


async def interrupt_when_in_flight(
    runtime: Runtime, factory: SlowCommitFactory, text: str
) -> tuple[str, list[Event]]:
    thread_id = (await runtime.create_thread()).thread_id
    async with runtime.start_session(thread_id) as session:
        turn_id = await session.submit(UserInput(text))
        assert turn_id is not None
        with anyio.fail_after(20):
            await factory.in_flight.wait()
        await session.submit(Interrupt(turn_id))
        seen = await events_until(session)
        assert seen[-1].event == TurnAborted(turn_id, AbortReason.INTERRUPTED)
        # The session is alive: the next input is answered.
        again = await session.submit(UserInput("still there?"))
        done = await events_until(session)
        assert done[-1].event == TurnComplete(again, "You said: still there?")
    events = [e.event for e in (await runtime.event_page(thread_id, limit=10_000)).events]
    return thread_id, events


async def test_an_interrupt_during_an_in_turn_commit_append(tmp_path: Path) -> None:
    step: list[ScriptStep] = [
        boundary(),
        ToolCallCompleted("call_1", "lookup", '{"q": "x"}'),
        Usage(TokenUsage(5, 5, 10)),
        Completed(),
    ]
    engine = ScriptedEngine(turns=[step])
    factory = SlowCommitFactory(tmp_path / "threads", CompactionCommitted)
    async with runtime_on(factory, engine) as runtime:
        thread_id, events = await interrupt_when_in_flight(runtime, factory, "go")
    assert calls_without_results(events) == []
    # Cold: a new runtime on the same files reads the same.
    async with runtime_on(
        SlowCommitFactory(tmp_path / "threads", CompactionCommitted), engine
    ) as cold:
        again = [e.event for e in (await cold.event_page(thread_id, limit=10_000)).events]
        assert again == events


async def test_an_interrupt_during_an_automatic_compaction_append(tmp_path: Path) -> None:
    engine = ScriptedEngine(context_window=400)
    factory = SlowCommitFactory(tmp_path / "threads", CompactionStarted)
    async with runtime_on(factory, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        for i in range(6):
            await runtime.persist_turn_item(thread_id, "t0", filler(i))
        async with runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput("compact first"))
            assert turn_id is not None
            with anyio.fail_after(20):
                await factory.in_flight.wait()
            await session.submit(Interrupt(turn_id))
            seen = await events_until(session)
            assert seen[-1].event == TurnAborted(turn_id, AbortReason.INTERRUPTED)
            factory.kind = type(None)  # no more slow appends
            again = await session.submit(UserInput("still there?"))
            done = await events_until(session)
            assert isinstance(done[-1].event, (TurnComplete, TurnAborted))
            assert done[-1].event.turn_id == again


def filler(i: int) -> AssistantMessage:
    """Return an item of about a hundred tokens (the history outgrows a 400-token window)."""
    return AssistantMessage(f"filler {i} " + "w" * 400)
