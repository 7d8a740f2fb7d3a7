"""What the turn driver needs from its session and gives back (its seams, as protocols).

A :class:`TurnSink` records a turn's events, an :class:`Inbox` holds its steering, a
:class:`ToolRunner` runs its tool steps; a :class:`TurnOutcome` says how it ended and a
:class:`StepState` what one model step produced so far; :class:`HeldUsage` journals a model
step's usage with the response's id and finish reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from roder_api.events import AbortReason, AssistantContentDelta, Event, UsagePurpose
from roder_api.inference import Completed, TokenUsage, ToolSpec
from roder_api.transcript import ToolCallRecord, ToolResultRecord, TranscriptItem
from roder_runtime.model._call import PreemptSignal, usage_updated
from roder_runtime.store._journal import Journal
from roder_runtime.tools._tool_step import CallState


class TurnSink(Protocol):
    """Where a turn's events go: the session's recorder (persisted before delivered)."""

    closing: bool
    """True once the session is closing (its consumer is gone; not an interrupt)."""

    @property
    def journal(self) -> Journal:
        """Return the thread's journal, appending in order with the recorder."""
        ...

    def stream(self, event: AssistantContentDelta) -> None:
        """Record streamed text now, or raise ``RecorderFullError`` (the consumer fell behind)."""
        ...

    async def record(self, *events: Event) -> None:
        """Record events that must not be lost, waiting for room (one batch when possible)."""
        ...

    async def persisted(self) -> None:
        """Wait until everything recorded so far is persisted."""
        ...


class Inbox(Protocol):
    """The steering of the running turn, kept by the session."""

    def take(self) -> list[str]:
        """Return (and remove) the steering texts that arrived, in order."""
        ...

    def take_or_close(self) -> list[str]:
        """Return the steering that arrived; when there is none, accept no more (atomically)."""
        ...

    def close(self) -> list[str]:
        """Accept no more steering; return what arrived and was not taken."""
        ...

    def preempt(self) -> AbstractContextManager[PreemptSignal]:
        """Return a block during which a ``Steer`` sets the yielded event."""
        ...


class ToolRunner(Protocol):
    """Runs one tool step: the calls of a model step, journaling their results in order."""

    @property
    def specs(self) -> Sequence[ToolSpec]:
        """The tools the model is offered."""
        ...

    left_pending: bool
    """True when a close left calls waiting for approval without results (the turn stays
    open for the next session)."""

    async def run(
        self,
        calls: Sequence[ToolCallRecord],
        states: Mapping[str, CallState] | None = None,
    ) -> list[ToolResultRecord]:
        """Run ``calls`` (``states``: what the journal knows of each after a restart);
        journal and return their results in the order of the calls."""
        ...


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How a turn ended: ``reason`` is None when it completed, else why it was aborted."""

    turn_id: str
    reason: AbortReason | None
    last_text: str | None = None


@dataclass
class StepState:
    """What one model step produced so far (staged; journaled at its end)."""

    step_id: str = ""
    text: str = ""
    reasoning: str = ""
    items: list[TranscriptItem] = field(default_factory=list)
    completed: bool = False
    failure: str | None = None
    preempted: bool = False  # a steer stopped it while it held a staged boundary


@dataclass
class HeldUsage:
    """A turn's model-call usage, journaled one engine event late.

    Engines report a call's usage right before its ``Completed``, which carries the
    provider's response id and finish reason; holding the usage until the next event lets
    them travel on the same ``UsageUpdated``. Whatever ends the attempt, :meth:`settle`
    journals what is held, so every attempt is still billed.
    """

    sink: TurnSink
    turn_id: str
    model: str
    provider: str
    held: TokenUsage | None = None

    async def hold(self, usage: TokenUsage) -> None:
        """Journal the usage held so far (if any) and hold ``usage``."""
        await self.release(None)
        self.held = usage

    async def release(self, event: object) -> None:
        """Journal the held usage; with the response's id and reason when ``event`` is
        the ``Completed`` that followed it."""
        usage, self.held = self.held, None
        if usage is None:
            return
        done = event if isinstance(event, Completed) else None
        purpose = UsagePurpose.TURN
        await self.sink.record(
            usage_updated(self.turn_id, usage, purpose, self.model, self.provider, done)
        )

    async def settle(self) -> None:
        """Journal what is held when an attempt ended, even when the turn is cancelled."""
        if self.held is not None:
            with anyio.CancelScope(shield=True):
                await self.release(None)
