"""One owner per turn concern: input journaling, a turn's end, in-turn compaction, tool options.

The shape is checked on the source (which modules build the events), the behaviour on real
sessions over a real JSONL store that counts the reads a turn makes.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import (
    InputAccepted,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
)
from roder_api.inference import Completed, InferenceProviderContext, MessageDelta, ModelDescriptor
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadMetadata
from roder_api.transcript import AssistantMessage, ProviderMetadata, UserMessage
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, UserInput

from .conftest import REPO

pytestmark = pytest.mark.anyio

RUNTIME = REPO / "roder_runtime"


def _constructed_in(*names: str) -> dict[str, set[str]]:
    """Return, for each event class in ``names``, the runtime modules that construct it."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in found:
                    found[node.func.id].add(path.relative_to(RUNTIME).as_posix())
    return found


def test_input_acceptance_is_journaled_by_one_module() -> None:
    found = _constructed_in("InputAccepted")
    assert len(found["InputAccepted"]) == 1, found


def test_a_turns_end_is_composed_by_one_module() -> None:
    found = _constructed_in("TurnAborted", "TurnComplete")
    assert len(found["TurnAborted"] | found["TurnComplete"]) == 1, found


def test_tool_options_reach_the_driver_as_a_frozen_dataclass(tmp_path: Path) -> None:
    from roder_runtime.config._sections import ToolsConfig
    from roder_runtime.session._tools import SessionTools

    class Sink:
        closing = False

    tools = SessionTools({}, ToolsConfig(), thread_id="t")
    options = tools.driver_options("turn", Sink(), None)  # type: ignore[arg-type]
    assert dataclasses.is_dataclass(options) and not isinstance(options, dict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.resume = None  # type: ignore[misc]


class CountingStore(JsonlThreadStore):
    """A real JSONL store that counts the reads it is asked for."""

    def __init__(self, base_path: Path) -> None:
        super().__init__(base_path)
        self.reads: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.reads[what] = self.reads.get(what, 0) + 1

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        self._count("get_thread")
        return await super().get_thread(thread_id)

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        self._count("read_events")
        return await super().read_events(thread_id, after=after, limit=limit)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        self._count("replay_events")
        return await super().replay_events(thread_id)


class CountingFactory(JsonlThreadStoreFactory):
    store: CountingStore | None = None

    async def open(self) -> JsonlThreadStore:
        await super().open()
        self.store = CountingStore(self.base_path)
        return self.store


async def _until_end(session: object, turn_id: str) -> list[JournalEvent]:
    seen: list[JournalEvent] = []
    with anyio.fail_after(20):
        while True:
            entry = await session.next_event()  # type: ignore[attr-defined]
            seen.append(entry)
            if isinstance(entry.event, (TurnComplete, TurnAborted)):
                if entry.event.turn_id == turn_id:
                    return seen


@pytest.mark.parametrize("native", [False, True])
async def test_a_turn_reads_its_history_once_and_nothing_more(tmp_path: Path, native: bool) -> None:
    """A turn reads the replay once; no mark (a metadata read) and no event read, on an
    engine without native compaction and (the history's read sequence is the mark) with it."""
    factory = CountingFactory(tmp_path / "threads")
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(native_compaction=native))
    builder.thread_store_factory(factory)
    async with Runtime(builder.build()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            for text in ("one", "two"):
                assert factory.store is not None
                factory.store.reads.clear()
                turn_id = await session.submit(UserInput(text))
                assert turn_id is not None
                seen = await _until_end(session, turn_id)
                assert isinstance(seen[-1].event, TurnComplete)
                assert factory.store.reads == {"replay_events": 1}


class SlowToListModels(ScriptedEngine):
    """A scripted engine whose ``list_models`` hangs once ``hang`` is set."""

    hang = False

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        if self.hang:
            await anyio.sleep_forever()
        return await super().list_models(ctx)


async def test_input_is_journaled_before_submit_returns_when_the_engine_is_slow(
    tmp_path: Path,
) -> None:
    """An engine that never lists its models (the auto-compaction check asks for the
    window): ``submit`` still returns, with the input journaled, and the turn ends."""
    engine = SlowToListModels()
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(tmp_path / "threads"))
    async with Runtime(builder.build(), RuntimeConfig(turn_timeout_s=1.0)) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            first = await session.submit(UserInput("one"))
            assert first is not None
            await _until_end(session, first)
            engine.hang = True
            with anyio.fail_after(20):
                second = await session.submit(UserInput("two"))
            assert second is not None
            journal = [e.event for e in (await runtime.event_page(thread_id, limit=100)).events]
            assert InputAccepted(second, "two") in journal or (
                ItemCompleted(second, UserMessage("two")) in journal
            )
            await _until_end(session, second)
        journal = [e.event for e in (await runtime.event_page(thread_id, limit=100)).events]
        assert ItemCompleted(second, UserMessage("two")) in journal


async def test_an_engine_without_compact_turn_still_compacts_in_a_turn(tmp_path: Path) -> None:
    """The in-turn flow starts for such an engine when it streams a boundary (no earlier):
    the boundary commits with its step, before the reply, conditional on the history's read."""
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "state"}
    boundary = ProviderMetadata({"provider": "t", "output": [item], "compacted_input": [item]})
    engine = ScriptedEngine(
        native_compaction=False, turns=[[boundary, MessageDelta("compacted"), Completed()]]
    )
    assert not engine.supports_native_compaction
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(tmp_path / "threads"))
    async with Runtime(builder.build()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "go") == "compacted"
        events = [e.event for e in (await runtime.event_page(thread_id, limit=100)).events]
        kinds = [type(e).__name__ for e in events]
        committed = kinds.index("CompactionCommitted")
        assert events[committed - 1] == ItemCompleted(events[committed].turn_id, boundary)  # type: ignore[attr-defined]
        assert kinds[committed + 1 :] == ["ItemCompleted", "TurnComplete"]
        assert await runtime.replay_history(thread_id) == [boundary, AssistantMessage("compacted")]
