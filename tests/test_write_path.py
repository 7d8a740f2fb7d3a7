"""The write path's shape: one encoding per event, and a tool step's appends sharing syncs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

import roder_api.codec as codec
from roder_api import ExtensionRegistryBuilder
from roder_api.errors import UnserializableEventError
from roder_api.events import Event, WarningEvent
from roder_api.storekit import EncodedEvents, payloads_of
from roder_api.testing import MemoryThreadStoreFactory, ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

from .session_support import add

pytestmark = pytest.mark.anyio


def runtime_on(factory: Any) -> Runtime:
    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine()).tool(add)
    builder.thread_store_factory(factory)
    return Runtime(builder.build(), RuntimeConfig())


def journal_lines(path: Path) -> list[list[str]]:
    """Return each ``events`` line of a JSONL journal as its event types (one commit each)."""
    lines = []
    for raw in path.read_bytes().splitlines():
        record = orjson.loads(raw)["r"]
        if record["k"] == "events":
            lines.append([event["type"] for event in record["events"]])
    return lines


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_a_session_encodes_each_event_once(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    factory = (
        MemoryThreadStoreFactory()
        if store == "memory"
        else JsonlThreadStoreFactory(base_path=tmp_path / "threads")
    )
    runtime = runtime_on(factory)
    encoded: list[str] = []
    to_dict = codec.to_dict

    def counting(obj: Any) -> Any:
        if isinstance(obj, Event):
            encoded.append(type(obj).__name__)
        return to_dict(obj)

    try:
        thread_id = (await runtime.create_thread()).thread_id
        monkeypatch.setattr(codec, "to_dict", counting)
        reply = await runtime.run_turn(thread_id, 'call add {"a": 2, "b": 3}', tools=["add"])
        monkeypatch.setattr(codec, "to_dict", to_dict)
        events = (await runtime.event_page(thread_id, limit=1000)).events
    finally:
        await runtime.aclose()
    assert reply == "add said: 5"
    # Every event journaled was encoded exactly once on its way (main: 2.7 times each).
    assert sorted(encoded) == sorted(type(e.event).__name__ for e in events)


def test_encoded_events_carry_their_bytes_and_plain_lists_are_encoded() -> None:
    events = [WarningEvent("one"), WarningEvent("two")]
    payloads = [codec.dumps(e) for e in events]
    batch = EncodedEvents(events, payloads)
    assert batch == events and payloads_of(batch) is batch.payloads
    assert payloads_of(events) == payloads
    batch.append(WarningEvent("three"))  # changed after its bytes were made: encoded anew
    assert payloads_of(batch) == [*payloads, codec.dumps(WarningEvent("three"))]
    with pytest.raises(ValueError, match="1 payloads for 2 events"):
        EncodedEvents(events, payloads[:1])
    with pytest.raises(UnserializableEventError, match="cannot serialise"):
        payloads_of([WarningEvent(object())])  # type: ignore[arg-type]


async def test_a_tool_steps_appends_share_syncs(tmp_path: Path, anyio_backend: str) -> None:
    runtime = runtime_on(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    try:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, 'call add {"a": 2, "b": 3}', tools=["add"])
    finally:
        await runtime.aclose()
    assert reply == "add said: 5"
    lines = journal_lines(tmp_path / "threads" / "threads" / f"{thread_id}.jsonl")
    started = next(i for i, line in enumerate(lines) if "tool_call_started" in line)
    result = started + 1
    # The result does not wait for its own sync: the next model step's start shares it.
    assert lines[result][:2] == ["item_completed", "model_step_started"], lines
    if anyio_backend == "asyncio":
        # The call's record and its ToolCallStarted (nothing runs between them): one sync.
        # (trio runs ready tasks in a shuffled order, so there the record may instead join
        # the step's usage line before it: as few syncs either way.)
        assert lines[started] == ["item_completed", "tool_call_started"], lines
    assert len(lines) <= 5, lines  # main: 6 (the result synced alone)
