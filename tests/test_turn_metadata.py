"""A turn's metadata: what the submitter attaches to its input, journaled once with it.

``UserInput(metadata=...)`` rides on the turn's first event: its ``TurnStarted`` when the
input starts the turn at once, its ``InputAccepted`` when the input waits (the turn's
``TurnStarted`` then carries none). It is checked like the input (JSON data, within
``max_input_bytes`` with the text) before anything is journaled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.codec import from_dict, to_dict
from roder_api.errors import InputTooLargeError, UnserializableEventError
from roder_api.events import InputAccepted, TurnAborted, TurnComplete, TurnStarted
from roder_api.inference import AgentInferenceRequest, InferenceEvent, InferenceTurnContext
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Interrupt, Runtime, RuntimeConfig, UserInput

pytestmark = pytest.mark.anyio


class GatedEngine(ScriptedEngine):
    """A scripted engine whose first turn waits for ``gate`` (so later input is queued)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.started = anyio.Event()
        self.calls = 0

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        self.calls += 1
        if self.calls == 1:
            self.started.set()
            await self.gate.wait()
        async with aclosing(super().stream_turn(ctx, request)) as events:
            async for event in events:
                yield event


def _runtime(tmp_path: Path, engine: ScriptedEngine, **config: Any) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(tmp_path / "threads"))
    return Runtime(builder.build(), RuntimeConfig(**config))


async def _until_ended(session: Any, turns: set[str]) -> list[Any]:
    """Take the session's events (it delivers them, in order) until ``turns`` all ended."""
    events: list[Any] = []
    with anyio.fail_after(20):
        while not turns <= {e.turn_id for e in events if isinstance(e, TurnComplete | TurnAborted)}:
            events.append((await session.next_event()).event)
    return events


async def test_metadata_rides_on_the_turns_first_event(tmp_path: Path) -> None:
    engine = GatedEngine()
    async with _runtime(tmp_path, engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            first = await session.submit(UserInput("one", metadata={"n": 1}))
            with anyio.fail_after(10):
                await engine.started.wait()  # the first turn runs (and waits)
            second = await session.submit(UserInput("two", metadata={"n": 2, "k": ["v"]}))
            third = await session.submit(UserInput("three", metadata={"n": 3}))
            assert third is not None
            await session.submit(Interrupt(third))  # never starts
            engine.gate.set()
            assert first is not None and second is not None
            events = await _until_ended(session, {first, second, third})
    carried = [e for e in events if getattr(e, "metadata", None) is not None]
    assert carried == [
        TurnStarted(first, {"n": 1}),
        InputAccepted(second, "two", metadata={"n": 2, "k": ["v"]}),
        InputAccepted(third, "three", metadata={"n": 3}),
    ]
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert [s.turn_id for s in starts] == [first, second, third]  # the third's: unstarted
    assert starts[1].metadata is None and starts[2].metadata is None


async def test_metadata_is_checked_before_anything_is_journaled(tmp_path: Path) -> None:
    async with _runtime(tmp_path, ScriptedEngine(), max_input_bytes=100) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            with pytest.raises(UnserializableEventError, match="metadata"):
                await session.submit(UserInput("hi", metadata={"when": object()}))
            with pytest.raises(InputTooLargeError):  # 2 + 111 bytes over 100
                await session.submit(UserInput("hi", metadata={"pad": "x" * 100}))
            assert (await runtime.get_thread(thread_id)).last_sequence == 0
            turn = await session.submit(UserInput("hi", metadata={"pad": "x" * 50}))
            assert turn is not None
            events = await _until_ended(session, {turn})
    assert events[0] == TurnStarted(turn, {"pad": "x" * 50})


def test_turn_started_without_metadata_reads_back_as_before() -> None:
    assert from_dict({"type": "turn_started", "turn_id": "t"}) == TurnStarted("t")
    assert TurnStarted("t").metadata is None
    written = to_dict(TurnStarted("t", {"a": [1, "b"]}))
    assert from_dict(written) == TurnStarted("t", {"a": [1, "b"]})
    old = {"type": "input_accepted", "turn_id": "t", "text": "x", "steer": False}
    assert from_dict(old) == InputAccepted("t", "x")
