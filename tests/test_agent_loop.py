"""The agent loop on a real JSONL store: model step, tool step, model step, approvals, limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.errors import UnknownToolError
from roder_api.events import (
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    ToolApprovalDecided,
    ToolApprovalRequested,
    ToolCallStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.inference import AgentInferenceRequest, InferenceTurnContext
from roder_api.testing import ScriptedEngine, ScriptStep, default_reply, tool_call
from roder_api.tools import Tool, ToolContext, tool
from roder_api.transcript import (
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import (
    ApproveToolCall,
    Interrupt,
    Runtime,
    RuntimeConfig,
    Session,
    ToolsConfig,
    UserInput,
)

pytestmark = pytest.mark.anyio

RUNS: list[str] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    RUNS.append("add")
    return a + b


@tool(requires_approval=True)
async def shout(text: str) -> str:
    """Shout a text."""
    RUNS.append("shout")
    return text.upper()


class Hanging(Tool):
    name = "hang"
    description = "Wait forever."
    started = anyio.Event

    def __init__(self) -> None:
        self.running = anyio.Event()

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str:
        self.running.set()
        await anyio.sleep_forever()
        return ""


def runtime_with(
    tmp_path: Path,
    engine: ScriptedEngine,
    *tools: Tool,
    config: RuntimeConfig | None = None,
) -> Runtime:
    builder = ExtensionRegistryBuilder().inference_engine(engine)
    for t in tools:
        builder.tool(t)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    return Runtime(builder.build(), config or RuntimeConfig())


async def journal(runtime: Runtime, thread_id: str) -> list[Event]:
    page = await runtime.event_page(thread_id, limit=1000)
    return [e.event for e in page.events]


def items_of(events: Sequence[Event], kind: type) -> list[Any]:
    return [e.item for e in events if isinstance(e, ItemCompleted) and isinstance(e.item, kind)]


def unanswered(events: Sequence[Event]) -> list[str]:
    calls = [c.id for c in items_of(events, ToolCallRecord)]
    answered = {r.id for r in items_of(events, ToolResultRecord)}
    return [c for c in calls if c not in answered]


async def until(session: Session, kind: type, turn_id: str | None = None) -> list[JournalEvent]:
    seen: list[JournalEvent] = []
    with anyio.fail_after(20):
        while True:
            entry = await session.next_event()
            seen.append(entry)
            if isinstance(entry.event, kind):
                return seen


async def test_a_turn_runs_tools_and_answers_from_their_results(tmp_path: Path) -> None:
    RUNS.clear()
    engine = ScriptedEngine()
    runtime = runtime_with(tmp_path, engine, add, shout, config=RuntimeConfig())
    try:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(
            thread_id, 'call add {"a": 2, "b": 3}; call add {"a": 1, "b": 1}', tools=["add"]
        )
        assert reply == "add said: 5; add said: 2"
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    assert RUNS == ["add", "add"]
    first, second = engine.requests
    assert [s.name for s in first[1].tools] == ["add"]
    assert first[1].tools[0].parameters == add.parameters
    replayed = [type(i).__name__ for i in second[1].transcript]
    assert replayed[-4:] == [
        "ToolCallRecord",
        "ToolCallRecord",
        "ToolResultRecord",
        "ToolResultRecord",
    ]
    kinds = []
    for event in events:
        if isinstance(event, ItemCompleted):
            kinds.append(type(event.item).__name__)
        elif isinstance(event, ToolCallStarted):
            kinds.append("started")
    calls_at = kinds.index("ToolCallRecord")
    assert kinds[calls_at : calls_at + 2] == ["ToolCallRecord", "ToolCallRecord"]
    assert kinds.count("started") == 2
    assert kinds.index("started") < kinds.index("ToolResultRecord")
    results = items_of(events, ToolResultRecord)
    assert [r.id for r in results] == ["call_1_add", "call_2_add"]
    assert isinstance(events[-1], TurnComplete) and unanswered(events) == []


async def test_the_tools_offered_follow_the_session_and_the_configuration(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine()
    config = RuntimeConfig(tools=ToolsConfig(enabled=["shout"]))
    runtime = runtime_with(tmp_path, engine, add, shout, config=config)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "hello")
        await runtime.run_turn(thread_id, "hello", tools=["add", "shout"])
        await runtime.run_turn(thread_id, "hello", tools=[])
        with pytest.raises(UnknownToolError, match="'nope'"):
            await runtime.run_turn(thread_id, "hello", tools=["nope"])
    finally:
        await runtime.aclose()
    offered = [[s.name for s in request.tools] for _, request in engine.requests]
    assert offered == [["shout"], ["add", "shout"], []]


async def test_past_max_tool_steps_calls_get_results_and_the_turn_aborts(tmp_path: Path) -> None:
    RUNS.clear()

    def always_call(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        return [tool_call("add", {"a": index, "b": 0}, id=f"c{index}"), *default_reply(request)]

    engine = ScriptedEngine(turns=always_call)
    config = RuntimeConfig(tools=ToolsConfig(max_tool_steps=2))
    runtime = runtime_with(tmp_path, engine, add, config=config)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "loop") is None
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    assert RUNS == ["add", "add"]
    results = items_of(events, ToolResultRecord)
    assert [(r.id, r.is_error) for r in results] == [("c0", False), ("c1", False), ("c2", True)]
    assert "max_tool_steps = 2" in results[2].result
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert errors and "limit of 2 tool steps" in errors[0].message
    assert events[-1] == TurnAborted(events[-1].turn_id, "failed")  # type: ignore[union-attr]
    assert unanswered(events) == []


async def test_approval_through_the_session_op(tmp_path: Path) -> None:
    RUNS.clear()
    engine = ScriptedEngine()
    runtime = runtime_with(tmp_path, engine, shout)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            await session.submit(UserInput('call shout {"text": "hi"}'))
            seen = await until(session, ToolApprovalRequested)
            request = seen[-1].event
            assert isinstance(request, ToolApprovalRequested) and request.name == "shout"
            assert RUNS == []
            await session.submit(ApproveToolCall(request.call_id, True))
            done = await until(session, TurnComplete)
            final = done[-1].event
            assert isinstance(final, TurnComplete)
            assert final.last_assistant_message == "shout said: HI"
            decided = [e.event for e in done if isinstance(e.event, ToolApprovalDecided)]
            assert decided == [ToolApprovalDecided(request.turn_id, request.call_id, True, None)]

            await session.submit(UserInput('call shout {"text": "no"}'))
            request = (await until(session, ToolApprovalRequested))[-1].event
            assert isinstance(request, ToolApprovalRequested)
            await session.submit(ApproveToolCall(request.call_id, False, "not today"))
            done = await until(session, TurnComplete)
        results = items_of([e.event for e in done], ToolResultRecord)
        assert results[0].is_error and "not today" in results[0].result
    finally:
        await runtime.aclose()
    assert RUNS == ["shout"]


async def test_run_turn_denies_calls_that_ask(tmp_path: Path) -> None:
    RUNS.clear()
    runtime = runtime_with(tmp_path, ScriptedEngine(), shout)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        reply = await runtime.run_turn(thread_id, 'call shout {"text": "x"}')
    finally:
        await runtime.aclose()
    assert reply is not None and "nobody can approve" in reply and RUNS == []


async def test_an_interrupt_cancels_running_tools_and_every_call_gets_a_result(
    tmp_path: Path,
) -> None:
    hang = Hanging()
    runtime = runtime_with(tmp_path, ScriptedEngine(), hang, add)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            turn_id = await session.submit(UserInput('call hang; call add {"a": 1, "b": 2}'))
            assert turn_id is not None
            with anyio.fail_after(10):
                await hang.running.wait()
            await anyio.sleep(0.3)  # add (in a worker thread) is done; its result waits in order
            await session.submit(Interrupt(turn_id))
            done = await until(session, TurnAborted)
        events = [e.event for e in done]
    finally:
        await runtime.aclose()
    results = items_of(events, ToolResultRecord)
    assert [r.result for r in results] == [
        "cancelled: the turn was interrupted while the tool ran",
        "3",
    ]
    assert events[-1] == TurnAborted(turn_id, "interrupted")


async def test_a_turn_left_in_a_tool_step_is_resumed_by_the_crash_rules(tmp_path: Path) -> None:
    """A journal as a SIGKILL leaves it: calls journaled, one started, none answered."""
    RUNS.clear()

    @tool(idempotent=True)
    def lookup(key: str) -> str:
        """Look a key up."""
        RUNS.append(f"lookup {key}")
        return f"value of {key}"

    @tool
    def send(to: str) -> str:
        """Send a message (not idempotent)."""
        RUNS.append(f"send {to}")
        return "sent"

    engine = ScriptedEngine()
    runtime = runtime_with(tmp_path, engine, lookup, send)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        turn = "turn_crashed"
        calls = [
            ToolCallRecord("c1", "send", '{"to": "bob"}'),
            ToolCallRecord("c2", "lookup", '{"key": "k"}'),
            ToolCallRecord("c3", "send", '{"to": "ann"}'),
        ]
        before: list[Event] = [
            TurnStarted(turn),
            ItemCompleted(turn, UserMessage("call send; call lookup; call send")),
            *[ItemCompleted(turn, c) for c in calls],
            ToolCallStarted(turn, "c1"),
            ToolCallStarted(turn, "c2"),
        ]
        await runtime.append_events(thread_id, before)
        async with runtime.start_session(thread_id) as session:
            done = await until(session, TurnComplete)
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    assert sorted(RUNS) == ["lookup k", "send ann"]  # c1 is never run again
    results = {r.id: r for r in items_of(events, ToolResultRecord)}
    assert results["c1"].is_error and "may or may not have taken effect" in results["c1"].result
    assert results["c2"].result == "value of k" and results["c3"].result == "sent"
    assert unanswered(events) == [] and isinstance(done[-1].event, TurnComplete)
    transcript: list[TranscriptItem] = list(engine.requests[-1][1].transcript)
    assert [i.id for i in transcript if isinstance(i, ToolResultRecord)] == ["c1", "c2", "c3"]


async def test_a_pending_approval_survives_a_kill_and_is_asked_again(tmp_path: Path) -> None:
    import sys

    from . import _approval_child

    threads = tmp_path / "threads"
    script = str(Path(__file__).with_name("_approval_child.py"))
    async with await anyio.open_process([sys.executable, script, str(threads), "t1"]) as child:
        assert child.stdout is not None
        output = b""
        with anyio.fail_after(60):
            while b"asked" not in output:
                output += await child.stdout.receive()
        child.kill()  # SIGKILL: the process dies with the approval pending
        await child.wait()
    async with _approval_child.build(threads) as runtime:
        async with runtime.start_session("t1") as session:
            asked = await until(session, ToolApprovalRequested)
            request = asked[-1].event
            assert isinstance(request, ToolApprovalRequested) and request.name == "wire_money"
            await session.submit(ApproveToolCall(request.call_id, True))
            done = await until(session, TurnComplete)
        events = await journal(runtime, "t1")
    final = done[-1].event
    assert isinstance(final, TurnComplete)
    assert final.last_assistant_message == "wire_money said: sent 5"
    requests = [e for e in events if isinstance(e, ToolApprovalRequested)]
    assert len(requests) == 2 and requests[0].call_id == requests[1].call_id
    assert unanswered(events) == []


async def test_automatic_compaction_never_falls_between_a_call_and_its_result(
    tmp_path: Path,
) -> None:
    from roder_api.events import CompactionCommitted, CompactionStarted

    @tool
    def bulky(n: int) -> str:
        """Return a lot of text (it fills the small context window)."""
        return "word " * 400

    def agent(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        done = sum(1 for i in request.transcript if isinstance(i, ToolResultRecord))
        if done < 3:
            return [tool_call("bulky", {"n": done}, id=f"b{index}"), *default_reply(request)[-2:]]
        return default_reply(request)

    engine = ScriptedEngine(turns=agent, context_window=600)
    runtime = runtime_with(tmp_path, engine, bulky)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        for _ in range(3):
            await runtime.run_turn(thread_id, "go " * 50)
        events = await journal(runtime, thread_id)
    finally:
        await runtime.aclose()
    assert any(isinstance(e, CompactionCommitted) for e in events), "no compaction was due"
    open_calls: set[str] = set()
    for event in events:
        if isinstance(event, ItemCompleted) and isinstance(event.item, ToolCallRecord):
            open_calls.add(event.item.id)
        elif isinstance(event, ItemCompleted) and isinstance(event.item, ToolResultRecord):
            open_calls.discard(event.item.id)
        elif isinstance(event, CompactionStarted):
            assert not open_calls, f"a compaction started with calls open: {open_calls}"
    assert unanswered(events) == []
