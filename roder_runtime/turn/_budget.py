"""Budgets: stop a turn before a model call that would take its cost past a limit.

A :class:`BudgetGuard` lives for one turn. Before each model call it brings its sums up to
date from the journal (the thread's whole journal once, then only what is new), prices the
call's estimated prompt as input tokens, and raises :class:`BudgetExceeded` saying which
budget and by how much when the turn's or the thread's cost would pass it.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Protocol

from roder_api.events import AbortReason, UsageUpdated
from roder_api.inference import InferenceEngine, TokenUsage
from roder_api.transcript import TranscriptItem
from roder_runtime.compaction._estimates import estimate_transcript_tokens
from roder_runtime.config._config import RuntimeConfig
from roder_runtime.config._sections import BudgetConfig
from roder_runtime.store._journal import Journal
from roder_runtime.turn._cost import ZERO, price
from roder_runtime.turn._seams import TurnSink


class BudgetExceeded(Exception):  # noqa: N818 - it ends the turn, it is not a bug
    """Raised when the next model call would take a budget past its limit."""


class Turn(Protocol):
    """What the guard reads of the turn it checks (a ``TurnDriver``), and sets on it."""

    sink: TurnSink
    config: RuntimeConfig
    instructions: str | None
    model: str
    engine: InferenceEngine
    abort_reason: AbortReason | None


class BudgetGuard:
    """Sums a thread's and a turn's priced usage and checks them before each model call."""

    def __init__(self, budget: BudgetConfig, journal: Journal, turn_id: str) -> None:
        self.budget = budget
        self.journal = journal
        self.turn_id = turn_id
        self.thread_usd = ZERO
        self.turn_usd = ZERO
        self._after = 0

    async def _catch_up(self) -> None:
        for entry in await self.journal.read_events(after=self._after):
            self._after = entry.sequence
            event = entry.event
            if isinstance(event, UsageUpdated):
                usd = price(event.usage, event.model, event.provider) or ZERO
                self.thread_usd += usd
                if event.turn_id == self.turn_id:
                    self.turn_usd += usd

    async def check(self, turn: Turn, history: Sequence[TranscriptItem]) -> None:
        """Raise ``BudgetExceeded`` when the turn's next call would pass a limit.

        The turn's ``abort_reason`` is then ``budget_exceeded``. Without limits this
        returns at once (nothing is read or priced).
        """
        if not self.budget.enabled:
            return
        await turn.sink.persisted()  # the usage billed so far is in the journal
        await self._catch_up()
        model = turn.model
        prompt = estimate_transcript_tokens(history, turn.instructions)
        next_call = price(TokenUsage(prompt_tokens=prompt), model, turn.engine.id) or ZERO
        limits = (
            ("max_usd_per_turn", self.budget.max_usd_per_turn, self.turn_usd),
            ("max_usd_per_thread", self.budget.max_usd_per_thread, self.thread_usd),
        )
        for name, limit, spent in limits:
            if limit is None:
                continue
            projected = spent + next_call
            if projected > Decimal(str(limit)):
                over = projected - Decimal(str(limit))
                turn.abort_reason = turn.abort_reason or AbortReason.BUDGET_EXCEEDED
                raise BudgetExceeded(
                    f"budget exceeded: [budget] {name} = ${limit:g}; spent ${_usd(spent)}, "
                    f"and the next model call ({model}, ~{prompt} prompt tokens, "
                    f"${_usd(next_call)}) would go ${_usd(over)} over it; raise the budget "
                    "in config.toml or start a new thread"
                )


def _usd(amount: Decimal) -> str:
    return f"{amount:.6f}".rstrip("0").rstrip(".") if amount else "0"
