"""The Runtime's thread API on the JSONL store, turns with the scripted engine, from_config."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_api.errors import InvalidThreadIdError, ThreadNotFoundError, UnknownEngineError
from roder_api.events import (
    AssistantContentDelta,
    ErrorEvent,
    Event,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import Raise, ScriptedEngine
from roder_api.transcript import AssistantMessage, ContextCompaction, UserMessage
from roder_runtime import Runtime, RuntimeConfig

from .conftest import make_runtime

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_thread_lifecycle(runtime: Runtime) -> None:
    meta = await runtime.create_thread(title="hello")
    thread_id = meta.thread_id
    await runtime.persist_turn_item(thread_id, "t1", UserMessage("hi"))
    await runtime.persist_turn_item(thread_id, "t1", AssistantMessage("hello"))
    await runtime.record_usage(thread_id, "t1", TokenUsage(10, 5, 15))
    await runtime.persist_turn_item(thread_id, "t2", UserMessage("again"))
    snapshot = await runtime.load_thread(thread_id)
    assert snapshot is not None
    assert [t.turn_id for t in snapshot.turns] == ["t1", "t2"]
    assert snapshot.items == [UserMessage("hi"), AssistantMessage("hello"), UserMessage("again")]
    assert snapshot.metadata.usage.total_tokens == 15
    assert snapshot.metadata.title == "hello"
    page = await runtime.list_threads()
    assert [m.thread_id for m in page.threads] == [thread_id]
    events = await runtime.event_page(thread_id, limit=2)
    assert [e.sequence for e in events.events] == [3, 4]
    await runtime.delete_thread(thread_id)
    assert await runtime.load_thread(thread_id) is None


async def test_explicit_ids_are_validated(runtime: Runtime) -> None:
    assert (await runtime.create_thread("my-thread")).thread_id == "my-thread"
    with pytest.raises(InvalidThreadIdError):
        await runtime.create_thread("../escape")
    with pytest.raises(ThreadNotFoundError):
        await runtime.persist_turn_item("missing", "t", UserMessage("x"))


async def test_replay_history_starts_at_the_last_boundary(runtime: Runtime) -> None:
    thread_id = (await runtime.create_thread()).thread_id
    await runtime.persist_turn_item(thread_id, "t1", UserMessage("old"))
    await runtime.persist_turn_item(thread_id, "t1", ContextCompaction("summary of old"))
    await runtime.persist_turn_item(thread_id, "t2", UserMessage("new"))
    assert await runtime.replay_history(thread_id) == [
        ContextCompaction("summary of old"),
        UserMessage("new"),
    ]
    snapshot = await runtime.load_thread(thread_id)
    assert snapshot is not None and len(snapshot.items) == 3


async def test_a_turn_persists_every_event_before_emitting_it(
    runtime: Runtime, engine: ScriptedEngine
) -> None:
    thread_id = (await runtime.create_thread()).thread_id
    seen: list[Event] = []

    async def emit(events: list[Event]) -> None:
        journal = await runtime.event_page(thread_id, limit=1000)
        persisted = [e.event for e in journal.events]
        for event in events:
            assert event in persisted
        seen.extend(events)

    reply = await runtime.run_turn(thread_id, "hello world", emit=emit)
    assert reply == "You said: hello world"
    assert isinstance(seen[0], TurnStarted)
    assert isinstance(seen[-1], TurnComplete) and seen[-1].last_assistant_message == reply
    deltas = [e.delta for e in seen if isinstance(e, AssistantContentDelta)]
    assert "".join(deltas) == reply
    assert (await runtime.replay_history(thread_id)) == [
        UserMessage("hello world"),
        AssistantMessage(reply),
    ]
    second = await runtime.run_turn(thread_id, "more")
    assert second == "You said: more"
    request = engine.requests[-1][1]
    assert list(request.transcript) == [
        UserMessage("hello world"),
        AssistantMessage(reply),
        UserMessage("more"),
    ]


async def test_turn_retries_retryable_failures_before_output_and_bills_each(
    tmp_path: Path,
) -> None:
    flaky = ScriptedEngine(
        turns=[
            [
                Usage(TokenUsage(5, 0, 5)),
                Raise(ProviderFailure(ProviderFailureKind.OVERLOADED, "busy")),
            ],
            [MessageDelta("ok"), Usage(TokenUsage(5, 1, 6)), Completed()],
        ]
    )
    config = RuntimeConfig()
    config.reliability.provider_retry_initial_backoff_ms = 0
    async with make_runtime(tmp_path, flaky, config=config) as rt:
        thread_id = (await rt.create_thread()).thread_id
        assert await rt.run_turn(thread_id, "hi") == "ok"
        meta = await rt.get_thread(thread_id)
        assert meta.usage.total_tokens == 11
        assert len(flaky.requests) == 2


async def test_non_retryable_failure_ends_the_turn_with_an_error(tmp_path: Path) -> None:
    failing = ScriptedEngine(
        turns=[[Raise(ProviderFailure(ProviderFailureKind.AUTHENTICATION, "bad key"))]]
    )
    async with make_runtime(tmp_path, failing) as rt:
        thread_id = (await rt.create_thread()).thread_id
        assert await rt.run_turn(thread_id, "hi") is None
        events = [e.event for e in (await rt.event_page(thread_id)).events]
        assert isinstance(events[-1], TurnAborted) and events[-1].reason == "failed"
        assert any(isinstance(e, ErrorEvent) and "bad key" in e.message for e in events)
        assert len(failing.requests) == 1
        assert failing.open_streams == 0


async def test_unknown_engine_is_a_clear_error(runtime: Runtime) -> None:
    with pytest.raises(UnknownEngineError, match="'scripted'"):
        runtime.engine("nope")


async def test_from_config_uses_entry_points_and_the_configured_path(tmp_path: Path) -> None:
    config = {"thread_store": {"backend": "jsonl", "path": str(tmp_path / "store")}}
    async with Runtime.from_config(config) as rt:
        thread_id = (await rt.create_thread()).thread_id
        await rt.persist_turn_item(thread_id, "t", UserMessage("persisted"))
    assert list((tmp_path / "store" / "threads").glob(f"*{thread_id}*"))
    async with Runtime.from_config(config) as rt:
        snapshot = await rt.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == [UserMessage("persisted")]


async def test_from_config_defaults_under_roder_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RODER_HOME", str(tmp_path / "home"))
    async with Runtime.from_config() as rt:
        thread_id = (await rt.create_thread()).thread_id
    assert list((tmp_path / "home" / "threads" / "threads").glob(f"{thread_id}*"))


async def test_usage_events_are_billed(runtime: Runtime) -> None:
    thread_id = (await runtime.create_thread()).thread_id
    await runtime.run_turn(thread_id, "count me")
    events = [e.event for e in (await runtime.event_page(thread_id)).events]
    billed = sum(e.usage.total_tokens for e in events if isinstance(e, UsageUpdated))
    assert billed > 0
    assert (await runtime.get_thread(thread_id)).usage.total_tokens == billed
    assert any(isinstance(e, ItemCompleted) for e in events)


async def test_open_reads_config_and_plugins_off_the_event_loop(tmp_path: Path) -> None:
    config = {"thread_store": {"backend": "jsonl", "path": str(tmp_path / "store")}}
    async with await Runtime.open(config) as rt:
        assert set(rt.registry.engines) >= {"scripted"}
        thread_id = (await rt.create_thread()).thread_id
        await rt.persist_turn_item(thread_id, "t", UserMessage("opened"))
    async with Runtime.from_config(config) as rt:
        snapshot = await rt.load_thread(thread_id)
        assert snapshot is not None and snapshot.items == [UserMessage("opened")]
