"""One chat turn on a session: submit the text, show the reply as it streams, Ctrl-C stops it.

Replies go to stdout; reasoning, notes and errors to stderr.
"""

from __future__ import annotations

import enum
import signal
import sys
from collections.abc import Awaitable, Callable

import anyio

from roder_api.errors import RoderError
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    Event,
    ItemCompleted,
    ToolApprovalRequested,
    TurnAborted,
    TurnComplete,
    WarningEvent,
)
from roder_api.transcript import ToolCallRecord
from roder_runtime.model._ids import new_id
from roder_runtime.session._ops import Interrupt, UserInput
from roder_runtime.session._session import Session
from roder_runtime.tools._tool_step import ApproveToolCall

Ask = Callable[[str], Awaitable[str | None]]
"""Ask the person a question on the terminal; return the line typed (None: no answer)."""


class TurnOutcome(str, enum.Enum):
    """How a chat turn ended."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    PENDING = "pending"
    """The chat ended at an approval question: the call stays pending (asked again later)."""


LEAVE = ("/exit", "/quit", "exit", "quit")
"""Answers to an approval question that end the chat and leave the call pending."""


def write(text: str) -> None:
    """Write reply text on stdout, at once."""
    sys.stdout.write(text)
    sys.stdout.flush()


def note(text: str) -> None:
    """Write a line (or more) for the person on stderr, at once."""
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


class _Printer:
    """Shows one turn's events: reply deltas on stdout, the rest on stderr."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.reasoning_open = False
        self.reply_open = False

    def show(self, event: Event) -> TurnOutcome | None:
        """Show ``event``; return the outcome when it ends this printer's turn."""
        if isinstance(event, AssistantContentDelta):
            if event.phase is ContentPhase.REASONING:
                self.reasoning_open = True
                sys.stderr.write(event.delta)
                sys.stderr.flush()
                return None
            if self.reasoning_open:
                note("")
                self.reasoning_open = False
            if event.delta:
                self.reply_open = not event.delta.endswith("\n")
                write(event.delta)
            return None
        if isinstance(event, ItemCompleted) and isinstance(event.item, ToolCallRecord):
            self.end_reply()
            note(f"roder: tool call {event.item.name}({event.item.arguments})")
            return None
        if isinstance(event, ErrorEvent):
            self.end_reply()
            note(f"roder: {event.message}")
            return None
        if isinstance(event, WarningEvent):
            self.end_reply()
            note(f"roder: warning: {event.message}")
            return None
        if isinstance(event, (TurnComplete, TurnAborted)):
            if event.turn_id != self.turn_id:
                if isinstance(event, TurnAborted) and event.reason == "process_exited":
                    note("roder: the last turn was cut off when its process exited")
                return None
            self.end_reply()
            if isinstance(event, TurnComplete):
                return TurnOutcome.COMPLETED
            if event.reason == "interrupted":
                note("roder: turn interrupted")
                return TurnOutcome.INTERRUPTED
            return TurnOutcome.FAILED
        return None

    def end_reply(self) -> None:
        if self.reasoning_open:
            note("")
            self.reasoning_open = False
        if self.reply_open:
            write("\n")
            self.reply_open = False


async def approve(session: Session, request: ToolApprovalRequested, ask: Ask | None) -> bool:
    """Ask y/n whether a tool call may run, and submit the answer (no way to ask: no).

    Return False, deciding nothing, when the person ends the chat at the question (Ctrl-D,
    ``/exit``): the call stays pending and the next ``roder chat -c`` asks again.
    """
    answer: str | None = ""
    if ask is not None:
        try:
            answer = await ask(f"roder: allow {request.name}({request.arguments})? [y/N] ")
        except KeyboardInterrupt:  # Ctrl-C at the question: no
            answer = ""
        if answer is None or answer.strip().lower() in LEAVE:
            note(f"roder: {request.name} still waits for approval; roder chat -c asks again")
            return False
    approved = (answer or "").strip().lower() in ("y", "yes")
    reason = None if approved else "the user said no in roder chat"
    if ask is None:
        reason = "no terminal to ask for approval (roder prompt or piped input)"
    note("roder: allowed" if approved else "roder: denied")
    await session.submit(ApproveToolCall(request.call_id, approved, reason))
    return True


async def run_turn(session: Session, text: str, ask: Ask | None = None) -> TurnOutcome:
    """Run one turn of ``text`` on ``session`` and show it; Ctrl-C (SIGINT) interrupts it.

    A tool call that needs approval is asked about with ``ask`` (y/n). A store failure
    while reading the turn's events is raised (``RoderError``).
    """
    # The id is the chat's before submit returns: the turn may end before that.
    turn_id = new_id("turn")
    await session.submit(UserInput(text), turn_id=turn_id)
    return await follow_turn(session, turn_id, ask)


async def follow_turn(session: Session, turn_id: str, ask: Ask | None = None) -> TurnOutcome:
    """Show turn ``turn_id`` of ``session`` (already running, or resumed) until it ends.

    As :func:`run_turn`: approvals asked with ``ask``, Ctrl-C interrupts the turn; ending
    the chat at an approval question returns ``TurnOutcome.PENDING`` at once.
    """
    printer = _Printer(turn_id)
    outcome: TurnOutcome | None = None
    failure: RoderError | None = None
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async with anyio.create_task_group() as tasks:

            async def interrupt_on_sigint() -> None:
                async for _ in signals:
                    await session.submit(Interrupt(turn_id))

            tasks.start_soon(interrupt_on_sigint)
            try:
                while outcome is None:
                    event = (await session.next_event()).event
                    if isinstance(event, ToolApprovalRequested):
                        printer.end_reply()
                        if not await approve(session, event, ask):
                            outcome = TurnOutcome.PENDING
                            break
                    outcome = printer.show(event)
            except RoderError as exc:
                # The store failed: what was shown is journaled, nothing more can be.
                printer.end_reply()
                failure = exc
            tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    assert outcome is not None
    return outcome
