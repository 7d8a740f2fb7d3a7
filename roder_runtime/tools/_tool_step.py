"""One tool step: run the tool calls of a model step, journal their results, keep the rules.

The calls of one step run concurrently; their results are journaled in the order the model
asked. ``ToolCallStarted`` is journaled (durably: ``append`` returns once it is persisted)
right before a tool's ``call()``, so that after a crash the journal tells a call that never
started (run it) from one that may have taken effect (run it again only when the tool is
idempotent; otherwise its result says so). Failure is data: a tool that raises, times out,
gets arguments that are not JSON or do not fit its schema, is unknown, is denied or is
interrupted gives the model an error result with a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from roder_api.codec import find_unserializable
from roder_api.errors import RoderError
from roder_api.events import (
    Event,
    ItemCompleted,
    ToolApprovalDecided,
    ToolApprovalRequested,
    ToolCallStarted,
)
from roder_api.inference import ToolSpec
from roder_api.tools import ApprovalPolicy, Tool, ToolContext, ToolOutput, arguments_error
from roder_api.transcript import ToolCallRecord, ToolResultRecord
from roder_runtime.config._sections import ToolsConfig

Append = Callable[[Sequence[Event]], Awaitable[object]]
"""Journal a batch of events in order with everything before it; return once a batch with
``ToolCallStarted`` or ``ToolApprovalRequested`` is persisted (others may still be on their
way, as long as nothing recorded after them is persisted first)."""

CRASHED_WHILE_RUNNING = (
    "the process exited while it ran; it may or may not have taken effect "
    "(the tool is not idempotent, so it was not run again)"
)
"""The result of a non-idempotent call that started before a crash and never finished."""

ABANDONED_ON_INTERRUPT = (
    "abandoned: the turn was interrupted while the tool ran in a worker thread, which "
    "cannot be stopped; it may still be running and may still take effect"
)
"""The result of a blocking call an interrupt could not stop (never "cancelled")."""

_REASON_LIMIT = 1000


class ToolStepLimitError(Exception):
    """Raised by :meth:`ToolStep.run` past ``max_tool_steps``, after it journaled a result
    for each call it refused; the turn ends with this message."""


@dataclass(frozen=True, slots=True)
class ApproveToolCall:
    """An op: approve (or deny, with an optional ``reason``) tool call ``call_id``."""

    call_id: str
    approved: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JournaledApproval(ApproveToolCall):
    """A decision another process already journaled (``ToolApprovalDecided``, taken by
    the lease holder's session from its journal): the call that waits for it takes it
    without journaling it a second time."""


Decide = Callable[[ToolApprovalRequested], Awaitable[ApproveToolCall]]
"""Wait for the user's decision on a call that asks for approval."""


@dataclass(frozen=True, slots=True)
class CallState:
    """What the journal says about one call of an unfinished step (after a restart)."""

    started: bool = False
    decision: ToolApprovalDecided | None = None


@dataclass(frozen=True, slots=True)
class PendingToolStep:
    """The calls of a turn's last step that have no result yet, and what is known of each."""

    calls: tuple[ToolCallRecord, ...]
    states: Mapping[str, CallState] = field(default_factory=dict)


def pending_tool_step(events: Iterable[Event]) -> PendingToolStep | None:
    """Return the calls of the given turn events that have no result, or None when none.

    ``events`` are one turn's events in journal order. The calls returned keep the order
    the model asked for them.
    """
    calls: dict[str, ToolCallRecord] = {}
    started: set[str] = set()
    decisions: dict[str, ToolApprovalDecided] = {}
    for event in events:
        if isinstance(event, ItemCompleted):
            item = event.item
            if isinstance(item, ToolCallRecord):
                calls[item.id] = item
            elif isinstance(item, ToolResultRecord):
                calls.pop(item.id, None)
        elif isinstance(event, ToolCallStarted):
            started.add(event.call_id)
        elif isinstance(event, ToolApprovalDecided):
            decisions[event.call_id] = event
    if not calls:
        return None
    states = {call_id: CallState(call_id in started, decisions.get(call_id)) for call_id in calls}
    return PendingToolStep(tuple(calls.values()), states)


def past_limit_results(calls: Sequence[ToolCallRecord], limit: int) -> list[ToolResultRecord]:
    """Return the results of calls asked for past ``max_tool_steps``: none of them ran."""
    text = f"not run: the turn reached max_tool_steps = {limit} tool steps"
    return [ToolResultRecord(c.id, c.name, text, is_error=True) for c in calls]


def past_limit_message(limit: int) -> str:
    """Return the error of a turn that asked for tools past ``max_tool_steps``."""
    return (
        f"the turn reached its limit of {limit} tool steps ([tools] max_tool_steps); "
        "the model still asked for tools"
    )


def approval_policy(tool: Tool, config: ToolsConfig) -> ApprovalPolicy:
    """Return the policy for ``tool``: its ``[tools.approval]`` entry, else from the tool."""
    configured = config.approval.get(tool.name)
    if configured is not None:
        return ApprovalPolicy(configured)
    return ApprovalPolicy.ASK if tool.requires_approval else ApprovalPolicy.AUTO


def cut_output(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` UTF-8 bytes, with a note saying how much was cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    cut = len(data) - len(kept.encode("utf-8", "surrogatepass"))
    return f"{kept}\n[output cut: {cut} of {len(data)} bytes not shown]"


def one_line(text: str) -> str:
    """Return ``text`` on one line, at most about a thousand characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _REASON_LIMIT else flat[: _REASON_LIMIT - 1] + "…"


def _interrupted(ctx: ToolContext | None) -> str:
    """Return the result of a call an interrupt stopped (``ctx``: it started, else None)."""
    if ctx is None:
        return "not run: the turn was interrupted"
    if ctx.abandoned:
        return ABANDONED_ON_INTERRUPT
    return "cancelled: the turn was interrupted while the tool ran"


def _seconds(value: float) -> str:
    return f"{value:g} s"


class ToolStep:
    """Runs the calls of model steps for one turn (see the module docstring).

    ``append`` journals events (it returns once they are persisted); ``decide`` waits for
    the user's decision on ``ask`` calls (None: nobody can approve, such calls are denied);
    ``closing`` says whether the session is closing (a stop that is not an interrupt).
    """

    def __init__(
        self,
        *,
        thread_id: str,
        turn_id: str,
        tools: Mapping[str, Tool],
        config: ToolsConfig,
        append: Append,
        decide: Decide | None = None,
        settings: Mapping[str, Any] | None = None,
        closing: Callable[[], bool] | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.turn_id = turn_id
        self.tools = tools
        self.config = config
        self._append = append
        self._decide = decide
        self._settings: Mapping[str, Any] = settings or {}
        self.specs: tuple[ToolSpec, ...] = tuple(tool.spec() for tool in tools.values())
        self.steps_run = 0
        self._closing = closing or (lambda: False)
        self.left_pending = False
        """True once a close left calls waiting for approval without results: the turn
        stays open, and the next session asks again (a pending approval survives)."""
        self._asking: set[str] = set()  # calls whose approval was asked and not yet given

    async def run(
        self,
        calls: Sequence[ToolCallRecord],
        states: Mapping[str, CallState] | None = None,
    ) -> list[ToolResultRecord]:
        """Run ``calls`` concurrently and journal their results in order; return them.

        ``states`` is what the journal knows of each call after a restart. When this task
        is cancelled (an interrupt), every call without a result gets one saying so, then
        the cancellation goes on. Past ``max_tool_steps`` steps no call runs: each gets an
        error result and :class:`ToolStepLimitError` is raised.
        """
        limit = self.config.max_tool_steps
        if self.steps_run >= limit:
            refused = past_limit_results(calls, limit)
            await self._append([ItemCompleted(self.turn_id, r) for r in refused])
            raise ToolStepLimitError(past_limit_message(limit))
        self.steps_run += 1
        known = states or {}
        results: list[ToolResultRecord | None] = [None] * len(calls)
        started: dict[str, ToolContext] = {}
        journaled = 0
        lock = anyio.Lock()

        async def publish() -> None:
            nonlocal journaled
            async with lock:
                ready: list[Event] = []
                while journaled < len(calls) and results[journaled] is not None:
                    result = results[journaled]
                    assert result is not None
                    ready.append(ItemCompleted(self.turn_id, result))
                    journaled += 1
                if ready:
                    # Shielded: a result handed to the journal is counted as journaled.
                    with anyio.CancelScope(shield=True):
                        await self._append(ready)

        async def run_one(index: int, call: ToolCallRecord) -> None:
            try:
                result = await self._run_call(call, known.get(call.id), started)
            except RoderError:
                raise  # the journal failed: the turn ends, and says so
            except Exception as exc:  # noqa: BLE001 - no call is left without a result
                result = self._error(
                    call, f"the call could not be run: {type(exc).__name__}: {exc}"
                )
            results[index] = result
            await publish()

        try:
            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(run_one, index, call)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                # Closed (not interrupted) while asking: leave it for the next session.
                keep = self._closing() and any(c.id in self._asking for c in calls)
                for index, call in enumerate(calls):
                    if results[index] is None:
                        if keep and call.id not in started:
                            continue  # never ran: the next session asks (or runs) it
                        results[index] = self._error(call, _interrupted(started.get(call.id)))
                self.left_pending = keep
                await publish()  # in order: up to the first call left pending
            raise
        return [r for r in results if r is not None]

    def _error(self, call: ToolCallRecord, reason: str) -> ToolResultRecord:
        text = cut_output(one_line(reason), self.config.max_tool_output_bytes)
        return ToolResultRecord(call.id, call.name, text, is_error=True)

    async def _run_call(
        self, call: ToolCallRecord, state: CallState | None, started: dict[str, ToolContext]
    ) -> ToolResultRecord:
        tool = self.tools.get(call.name)
        if tool is None:
            offered = ", ".join(sorted(self.tools)) or "none"
            return self._error(call, f"unknown tool {call.name!r}; the tools offered: {offered}")
        if state is not None and state.started and not tool.idempotent:
            return self._error(call, CRASHED_WHILE_RUNNING)
        try:
            arguments = orjson.loads(call.arguments) if call.arguments.strip() else {}
        except orjson.JSONDecodeError as exc:
            return self._error(call, f"the arguments are not valid JSON: {exc}")
        if not isinstance(arguments, dict):
            return self._error(call, "the arguments must be a JSON object")
        problem = arguments_error(tool.parameters, arguments)
        if problem is not None:
            return self._error(call, f"the arguments do not fit the tool's schema: {problem}")
        denial = await self._approve(tool, call, state)
        if denial is not None:
            return self._error(call, denial)
        ctx = ToolContext(self.thread_id, self.turn_id, call.id, self._settings)
        started[call.id] = ctx
        with anyio.CancelScope(shield=True):
            await self._append([ToolCallStarted(self.turn_id, call.id)])
        timeout = tool.timeout_s
        output: object = None
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        with anyio.CancelScope(deadline=deadline) as scope:
            try:
                output = await tool.call(ctx, arguments)
            except Exception as exc:  # noqa: BLE001 - a tool may raise anything: it is data
                return self._error(call, f"the tool raised {type(exc).__name__}: {exc}")
        if scope.cancelled_caught:
            waited = _seconds(timeout or 0)
            if ctx.abandoned:
                return self._error(
                    call,
                    f"timed out after {waited}; it ignored cancellation and was abandoned, "
                    "so it may still be running",
                )
            return self._error(call, f"timed out after {waited} and was cancelled")
        return self._result(call, output)

    def _result(self, call: ToolCallRecord, output: object) -> ToolResultRecord:
        limit = self.config.max_tool_output_bytes
        if isinstance(output, str):
            return ToolResultRecord(call.id, call.name, cut_output(output, limit))
        if isinstance(output, ToolOutput) and isinstance(output.text, str):
            payload = output.display_payload
            # Checked here, at the edge: a payload the journal refuses would end the turn
            # with this call unanswered.
            problem = (
                None
                if payload is None
                else find_unserializable({"display_payload": payload}, depth=2)
            )
            if problem is not None:
                path, reason = problem
                return self._error(
                    call,
                    f"the tool's result is not JSON data, so it cannot be kept: {path}: {reason}",
                )
            return ToolResultRecord(
                call.id,
                call.name,
                cut_output(output.text, limit),
                display_payload=output.display_payload,
                is_error=output.is_error,
            )
        kind = type(output).__name__
        return self._error(call, f"the tool returned {kind}, not a str or a ToolOutput")

    async def _approve(
        self, tool: Tool, call: ToolCallRecord, state: CallState | None
    ) -> str | None:
        """Return why the call may not run, or None when it may."""
        policy = approval_policy(tool, self.config)
        if policy is ApprovalPolicy.AUTO:
            return None
        if policy is ApprovalPolicy.DENY:
            return f'denied: [tools.approval] says {tool.name} = "deny"; the tool did not run'
        decided = state.decision if state is not None else None
        if decided is None:
            request = ToolApprovalRequested(self.turn_id, call.id, call.name, call.arguments)
            await self._append([request])
            if self._decide is None:
                answer = ApproveToolCall(call.id, False, "nobody can approve calls here")
            else:
                self._asking.add(call.id)
                answer = await self._decide(request)
                self._asking.discard(call.id)
            decided = ToolApprovalDecided(self.turn_id, call.id, answer.approved, answer.reason)
            if not isinstance(answer, JournaledApproval):  # else it is in the journal already
                await self._append([decided])
        if decided.approved:
            return None
        why = f": {one_line(decided.reason)}" if decided.reason else ""
        return f"denied by the user{why}; the tool did not run"


__all__ = [
    "ABANDONED_ON_INTERRUPT",
    "Append",
    "ApproveToolCall",
    "CRASHED_WHILE_RUNNING",
    "CallState",
    "Decide",
    "JournaledApproval",
    "PendingToolStep",
    "ToolStep",
    "ToolStepLimitError",
    "approval_policy",
    "cut_output",
    "one_line",
    "past_limit_message",
    "past_limit_results",
    "pending_tool_step",
]
