"""A session's tools: what its turns offer, the approvals it waits for, a tool step per turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

import anyio

from roder_api.events import Event, ToolApprovalRequested, ToolCallStarted
from roder_api.extension import ExtensionRegistry
from roder_api.inference import ToolSpec
from roder_api.tools import Tool
from roder_runtime.config._sections import ToolsConfig
from roder_runtime.session._ops import Steer, UserInput
from roder_runtime.store._journal import ThreadJournal
from roder_runtime.tools._client_tools import ClientTurns, TurnOptions
from roder_runtime.tools._tool_step import ApproveToolCall, PendingToolStep, ToolStep
from roder_runtime.turn._seams import TurnSink


def offered_tools(
    registry: ExtensionRegistry, config: ToolsConfig, names: Sequence[str] | None
) -> dict[str, Tool]:
    """Return the tools a session offers: for ``names`` None, every registered tool that
    ``config.enabled`` allows (all when it is unset); else exactly those named (each must be
    registered: ``UnknownToolError``)."""
    if names is None:
        if config.enabled is None:
            return dict(registry.tools)
        allowed = set(config.enabled)
        return {n: t for n, t in registry.tools.items() if n in allowed}
    return {name: registry.tool(name) for name in names}


class SessionTools:
    """The tools one session offers, and the ``ApproveToolCall`` decisions it was given.

    ``approvals`` False: nobody can approve (``run_turn``), so ``ask`` calls are denied.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool] | None,
        config: ToolsConfig,
        *,
        thread_id: str,
        settings: Mapping[str, Any] | None = None,
        approvals: bool = True,
    ) -> None:
        self.tools: Mapping[str, Tool] = dict(tools or {})
        self.config = config
        self.thread_id = thread_id
        self.specs: tuple[ToolSpec, ...] = tuple(t.spec() for t in self.tools.values())
        self._settings: Mapping[str, Any] = settings or {}
        self._approvals = approvals
        self._decisions: dict[str, ApproveToolCall] = {}
        self._awaiting: dict[str, anyio.Event] = {}
        self._client = ClientTurns()

    def turn_input(
        self, turn_id: str, op: UserInput | Steer, journal: ThreadJournal
    ) -> AbstractAsyncContextManager[None]:
        """Check ``op``'s client tools and tool results (``ToolCallNotOpenError``, nothing
        written) and keep them for turn ``turn_id`` while it is submitted in this block."""
        tools = op.client_tools if isinstance(op, UserInput) else ()
        results = op.tool_results if isinstance(op, UserInput) else ()
        instructions = op.instructions if isinstance(op, UserInput) else None
        return self._client.hold(turn_id, tools, results, journal, self.tools, instructions)

    def decide_call(self, decision: ApproveToolCall) -> None:
        """Take the user's decision on a call that waits (or is about to wait) for it."""
        self._decisions[decision.call_id] = decision
        waiting = self._awaiting.pop(decision.call_id, None)
        if waiting is not None:
            waiting.set()

    def waiting_for(self, call_id: str) -> bool:
        """Return True when a call with ``call_id`` waits for its decision."""
        return call_id in self._awaiting

    async def _decide(self, request: ToolApprovalRequested) -> ApproveToolCall:
        call_id = request.call_id
        while call_id not in self._decisions:
            event = self._awaiting.setdefault(call_id, anyio.Event())
            try:
                await event.wait()
            finally:
                if call_id not in self._decisions:
                    self._awaiting.pop(call_id, None)
        return self._decisions.pop(call_id)

    def driver_options(
        self, turn_id: str, sink: TurnSink, resume: PendingToolStep | None
    ) -> TurnOptions:
        """Return the ``TurnDriver`` options for the tools of turn ``turn_id``."""

        async def append(events: Sequence[Event]) -> None:
            await sink.record(*events)
            if any(isinstance(e, (ToolCallStarted, ToolApprovalRequested)) for e in events):
                # Durable before the tool runs (ToolCallStarted), before anyone is asked.
                await sink.persisted()
            # Results need not wait: the recorder persists them before anything recorded
            # after them, so they share a sync with the next model step's start.

        step = self.step(turn_id, append, closing=lambda: sink.closing)
        return replace(self._client.take(turn_id), tool_step=step, resume=resume)

    def step(
        self,
        turn_id: str,
        append: Callable[[Sequence[Event]], Awaitable[None]],
        closing: Callable[[], bool] | None = None,
    ) -> ToolStep:
        """Return the tool step of turn ``turn_id``, journaling through ``append``
        (``closing``: whether the session is closing, which leaves approvals pending)."""
        return ToolStep(
            closing=closing,
            thread_id=self.thread_id,
            turn_id=turn_id,
            tools=self.tools,
            config=self.config,
            append=append,
            decide=self._decide if self._approvals else None,
            settings=self._settings,
        )
