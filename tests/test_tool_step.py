"""The tool step: concurrency, order, failure as data, deadlines, approval, interrupt, resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from roder_api.events import (
    Event,
    ItemCompleted,
    ToolApprovalDecided,
    ToolApprovalRequested,
    ToolCallStarted,
)
from roder_api.tools import ApprovalPolicy, Tool, ToolContext, ToolOutput, tool
from roder_api.transcript import ToolCallRecord, ToolResultRecord
from roder_runtime import ToolsConfig
from roder_runtime.tools._tool_step import (
    CRASHED_WHILE_RUNNING,
    ApproveToolCall,
    ToolStep,
    cut_output,
    pending_tool_step,
)

pytestmark = pytest.mark.anyio


class Journal:
    """What the step appended, in order (the append callback of a real session)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def append(self, events: Sequence[Event]) -> None:
        await anyio.lowlevel.checkpoint()
        self.events.extend(events)

    def kinds(self) -> list[str]:
        out = []
        for e in self.events:
            if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord):
                out.append(f"result:{e.item.id}")
            elif isinstance(e, ToolCallStarted):
                out.append(f"started:{e.call_id}")
            elif isinstance(e, ToolApprovalRequested):
                out.append(f"asked:{e.call_id}")
            elif isinstance(e, ToolApprovalDecided):
                out.append(f"decided:{e.call_id}:{e.approved}")
        return out


class Counting(Tool):
    """Counts its runs; sleeps ``delay`` seconds; optionally waits for a gate."""

    def __init__(self, name: str, *, delay: float = 0.0, idempotent: bool = False) -> None:
        self.name = name
        self.description = f"{name} tool"
        self.parameters = {"type": "object", "properties": {"n": {"type": "integer"}}}
        self.idempotent = idempotent
        self.delay = delay
        self.runs = 0

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str:
        self.runs += 1
        await anyio.sleep(self.delay)
        return f"{self.name} got {arguments.get('n')} in {ctx.call_id}"


def step(
    tools: Sequence[Tool], journal: Journal, config: ToolsConfig | None = None, **kwargs: Any
) -> ToolStep:
    return ToolStep(
        thread_id="thread_1",
        turn_id="turn_1",
        tools={t.name: t for t in tools},
        config=config or ToolsConfig(),
        append=journal.append,
        **kwargs,
    )


def call(call_id: str, name: str, arguments: str = "{}") -> ToolCallRecord:
    return ToolCallRecord(call_id, name, arguments)


async def test_calls_run_concurrently_and_results_are_journaled_in_order() -> None:
    slow, fast = Counting("slow", delay=1.0), Counting("fast", delay=0.0)
    journal = Journal()
    began = time.monotonic()
    results = await step([slow, fast], journal).run(
        [call("c1", "slow", '{"n": 1}'), call("c2", "fast", '{"n": 2}'), call("c3", "slow")]
    )
    # Run one after the other the two 1 s calls take 2 s at least; the margin is for a
    # loaded CI machine.
    assert time.monotonic() - began < 1.9  # two 1 s calls ran side by side
    assert [r.id for r in results] == ["c1", "c2", "c3"]
    assert results[0] == ToolResultRecord("c1", "slow", "slow got 1 in c1")
    assert results[1].result == "fast got 2 in c2" and not results[1].is_error
    kinds = journal.kinds()
    assert [k for k in kinds if k.startswith("result")] == ["result:c1", "result:c2", "result:c3"]
    for cid in ("c1", "c2", "c3"):  # each started before its result
        assert kinds.index(f"started:{cid}") < kinds.index(f"result:{cid}")
    assert slow.runs == 2 and fast.runs == 1


async def test_failures_are_error_results_with_one_line_reasons() -> None:
    @tool
    def explode(n: int) -> str:
        """Raise."""
        raise ValueError(f"bad\nnumber {n}")

    @tool(timeout_s=0.2)
    async def hang() -> str:
        """Hang."""
        await anyio.sleep_forever()
        return ""

    class Weird(Tool):
        name = "weird"

        async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
            return 42

    journal = Journal()
    results = await step([explode, hang, Weird(), Counting("count")], journal).run(
        [
            call("a", "explode", '{"n": 3}'),
            call("b", "hang"),
            call("c", "explode", "{not json"),
            call("d", "explode", '{"n": "three"}'),
            call("e", "count", "[1, 2]"),
            call("f", "missing"),
            call("g", "weird"),
        ]
    )
    reasons = {r.id: r.result for r in results}
    assert all(r.is_error for r in results)
    assert all("\n" not in text for text in reasons.values())
    assert reasons["a"] == "the tool raised ValueError: bad number 3"
    assert reasons["b"] == "timed out after 0.2 s and was cancelled"
    assert reasons["c"].startswith("the arguments are not valid JSON")
    assert reasons["d"] == (
        "the arguments do not fit the tool's schema: 'three' is not of type 'integer' (at $.n)"
    )
    assert reasons["e"] == "the arguments must be a JSON object"
    assert reasons["f"] == "unknown tool 'missing'; the tools offered: count, explode, hang, weird"
    assert reasons["g"] == "the tool returned int, not a str or a ToolOutput"
    started = {e.call_id for e in journal.events if isinstance(e, ToolCallStarted)}
    assert started == {"a", "b", "g"}  # bad arguments and unknown tools never start


async def test_output_over_the_limit_is_cut_with_a_note() -> None:
    @tool
    def big() -> ToolOutput:
        """Return a lot."""
        return ToolOutput("é" * 100, display_payload={"rows": 100})

    journal = Journal()
    (result,) = await step([big], journal, ToolsConfig(max_tool_output_bytes=51)).run(
        [call("a", "big")]
    )
    assert result.result == "é" * 25 + "\n[output cut: 150 of 200 bytes not shown]"
    assert result.display_payload == {"rows": 100} and not result.is_error
    assert cut_output("short", 10) == "short"


async def test_a_sync_tool_that_ignores_cancellation_is_abandoned() -> None:
    release = threading.Event()

    @tool(timeout_s=0.2)
    def stubborn() -> str:
        """Block in a thread."""
        release.wait(5)
        return "finally"

    journal = Journal()
    began = time.monotonic()
    try:
        (result,) = await step([stubborn], journal).run([call("a", "stubborn")])
    finally:
        release.set()
    assert time.monotonic() - began < 2
    assert result.is_error and result.result == (
        "timed out after 0.2 s; it ignored cancellation and was abandoned, "
        "so it may still be running"
    )


async def test_approval_auto_ask_and_deny() -> None:
    asked = Counting("asked")
    refused = Counting("refused")
    denied = Counting("denied")
    gated = Counting("gated")
    gated.requires_approval = True
    config = ToolsConfig(
        approval={
            "asked": ApprovalPolicy.ASK,
            "refused": ApprovalPolicy.ASK,
            "denied": ApprovalPolicy.DENY,
        }
    )
    requests: list[ToolApprovalRequested] = []

    async def decide(request: ToolApprovalRequested) -> ApproveToolCall:
        requests.append(request)
        await anyio.sleep(0.01)
        if request.name == "refused":
            return ApproveToolCall(request.call_id, False, "not\nnow")
        return ApproveToolCall(request.call_id, True)

    journal = Journal()
    results = await step([asked, refused, denied, gated], journal, config, decide=decide).run(
        [
            call("a", "asked", '{"n": 1}'),
            call("b", "refused"),
            call("c", "denied"),
            call("d", "gated"),
        ]
    )
    by_id = {r.id: r for r in results}
    assert by_id["a"].result == "asked got 1 in a" and not by_id["a"].is_error
    assert by_id["b"].is_error and by_id["b"].result == (
        "denied by the user: not now; the tool did not run"
    )
    assert by_id["c"].is_error and "deny" in by_id["c"].result
    assert not by_id["d"].is_error  # requires_approval without an entry: ask
    assert (asked.runs, refused.runs, denied.runs, gated.runs) == (1, 0, 0, 1)
    assert sorted(r.call_id for r in requests) == ["a", "b", "d"]
    assert [r.arguments for r in requests if r.call_id == "a"] == ['{"n": 1}']
    kinds = journal.kinds()
    assert "decided:b:False" in kinds and "decided:a:True" in kinds
    assert kinds.index("asked:a") < kinds.index("decided:a:True") < kinds.index("started:a")
    assert "asked:c" not in kinds and "started:b" not in kinds


async def test_ask_without_anyone_to_decide_is_a_denial() -> None:
    gated = Counting("gated")
    journal = Journal()
    config = ToolsConfig(approval={"gated": ApprovalPolicy.ASK})
    (result,) = await step([gated], journal, config).run([call("a", "gated")])
    assert result.is_error and "nobody can approve" in result.result and gated.runs == 0


async def test_an_interrupt_cancels_running_tools_and_every_call_gets_a_result() -> None:
    running = anyio.Event()

    @tool
    async def hang() -> str:
        """Hang until cancelled."""
        running.set()
        await anyio.sleep_forever()
        return ""

    waiting = Counting("waiting")
    never = anyio.Event()

    async def decide(request: ToolApprovalRequested) -> ApproveToolCall:
        await never.wait()
        raise AssertionError("unreachable")

    fast = Counting("fast")
    journal = Journal()
    config = ToolsConfig(approval={"waiting": ApprovalPolicy.ASK})
    runner = step([hang, waiting, fast], journal, config, decide=decide)
    with anyio.CancelScope() as scope:

        async def interrupt() -> None:
            await running.wait()
            await anyio.sleep(0.05)
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(interrupt)
            await runner.run([call("a", "hang"), call("b", "waiting"), call("c", "fast")])
            raise AssertionError("the step should have been cancelled")
    results = [
        e.item
        for e in journal.events
        if isinstance(e, ItemCompleted) and isinstance(e.item, ToolResultRecord)
    ]
    assert [r.id for r in results] == ["a", "b", "c"]
    assert results[0].result == "cancelled: the turn was interrupted while the tool ran"
    assert results[1].result == "not run: the turn was interrupted"
    assert not results[2].is_error and fast.runs == 1 and waiting.runs == 0


async def test_resume_after_a_crash_follows_the_journal() -> None:
    never_started = Counting("plain")
    started_plain = Counting("plain2")
    started_idem = Counting("idem", idempotent=True)
    approved_before = Counting("gated")
    calls = [
        call("a", "plain"),
        call("b", "plain2"),
        call("c", "idem"),
        call("d", "gated"),
        call("e", "plain"),
    ]
    before: list[Event] = [ItemCompleted("turn_1", c) for c in calls]
    before += [
        ToolCallStarted("turn_1", "b"),
        ToolCallStarted("turn_1", "c"),
        ToolApprovalRequested("turn_1", "d", "gated", "{}"),
        ToolApprovalDecided("turn_1", "d", True, None),
        ToolCallStarted("turn_1", "e"),
        ItemCompleted("turn_1", ToolResultRecord("e", "plain", "done")),
    ]
    pending = pending_tool_step(before)
    assert pending is not None
    assert [c.id for c in pending.calls] == ["a", "b", "c", "d"]
    assert pending.states["b"].started and not pending.states["a"].started
    journal = Journal()
    config = ToolsConfig(approval={"gated": ApprovalPolicy.ASK})

    async def decide(request: ToolApprovalRequested) -> ApproveToolCall:
        raise AssertionError("the journaled decision is used, nobody is asked again")

    tools = [never_started, started_plain, started_idem, approved_before]
    results = await step(tools, journal, config, decide=decide).run(pending.calls, pending.states)
    by_id = {r.id: r for r in results}
    assert not by_id["a"].is_error and never_started.runs == 1
    assert by_id["b"].is_error and by_id["b"].result == CRASHED_WHILE_RUNNING
    assert started_plain.runs == 0
    assert not by_id["c"].is_error and started_idem.runs == 1
    assert not by_id["d"].is_error and approved_before.runs == 1
    assert pending_tool_step([*before, *journal.events]) is None


async def test_a_pending_approval_is_asked_again_after_a_restart() -> None:
    gated = Counting("gated")
    before: list[Event] = [
        ItemCompleted("turn_1", call("a", "gated")),
        ToolApprovalRequested("turn_1", "a", "gated", "{}"),
    ]
    pending = pending_tool_step(before)
    assert pending is not None and pending.states["a"].decision is None

    async def decide(request: ToolApprovalRequested) -> ApproveToolCall:
        return ApproveToolCall(request.call_id, True)

    journal = Journal()
    config = ToolsConfig(approval={"gated": ApprovalPolicy.ASK})
    await step([gated], journal, config, decide=decide).run(pending.calls, pending.states)
    assert journal.kinds() == ["asked:a", "decided:a:True", "started:a", "result:a"]
    assert gated.runs == 1
