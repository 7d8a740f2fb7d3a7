"""Resuming a thread: close the turn a dead session left running, find its unanswered input.

A session that died (its process was killed, its task torn down) may leave a turn without
its end and input it accepted (``InputAccepted``) but never answered. Inputs start turns in
the order they were accepted, but input queued behind a running turn is accepted *before*
the turn after it starts: the tail read goes back past the journal's last ``TurnStarted``
until it has met the acceptance of every turn the thread's metadata says is open
(``ThreadMetadata.open_turns``), so nothing accepted and not yet started is missed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import anyio
import anyio.lowlevel

from roder_api.errors import SequenceConflictError, StoppedError, ThreadBusyError
from roder_api.events import (
    AbortReason,
    AssistantContentDelta,
    ContentPhase,
    Event,
    InputAccepted,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.storekit import FollowOn
from roder_api.threads import LeasedThread, ThreadLease, ThreadMetadata
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime.model._ids import new_id
from roder_runtime.session._recorder import EventRecorder
from roder_runtime.store._journal import ThreadJournal
from roder_runtime.tools._tool_step import PendingToolStep, pending_tool_step
from roder_runtime.turn._edges import turn_end

_PAGE = 256
_TRIES = 5

HOLD_S = 0.02
"""How long a new thread's create waits for :meth:`NewThread.go` at most."""

CreateThread = Callable[[], Awaitable[ThreadMetadata]]
"""Creates the thread alone (``Runtime.create_thread``)."""


class LeaseNew(Protocol):
    """Takes a new thread's lease and creates it with its first events, held while entered;
    what is offered to ``follow_on`` meanwhile is journaled after them, in the same store
    call where the store can (``ThreadJournal.lease_new``)."""

    def __call__(
        self, events: Sequence[Event], *, follow_on: FollowOn | None = None
    ) -> AbstractAsyncContextManager[LeasedThread]:
        """Return the context manager that takes the lease and makes the thread."""
        ...


class NewThread:
    """The lease and the create of a thread that a session opens on as it creates it
    (``Runtime.start_session(create=True)``), run while the session starts its first turn.

    Until :meth:`run` has done both, every store call of the session's journal waits
    (``ThreadJournal.creating``), so nothing is journaled before the thread exists and its
    lease is held; the engine may be called meanwhile. The journal's first append hands its
    events (the first turn's start) to :meth:`run`, which takes the lease and makes the
    thread with them in one store call (``lease_new``: ``ThreadStore.lease_new_thread``; the
    JSONL and SQLite stores take the file lock and write the thread in one worker call, the
    JSONL store with two syncs, the file and its directory), or takes the lease and makes
    the thread empty when none came; ``error`` is what stopped it, ``held`` what holds the
    lease (released by the session as it closes).

    Both wait for :meth:`go` (at most :data:`HOLD_S`): the session calls it once the first
    model request is on the wire (``roder_api.inference.request_sent``), at that call's
    first event or end, or as it closes. The blocking work then runs while the event loop
    waits for the model, instead of taking the interpreter from the loop while it builds
    and sends the request. Measured on ``benchmarks/openai_bench.py`` (a new conversation
    through ``roder serve``): the create after the request 0.4-0.8 ms sooner to the first
    delta; the lease in the create's worker call, rather than one of its own taken at once,
    0.3-0.7 ms sooner again.
    """

    def __init__(
        self,
        journal: ThreadJournal,
        recorder: EventRecorder,
        lease: AbstractAsyncContextManager[ThreadLease],
        create: CreateThread,
        lease_new: LeaseNew | None = None,
    ) -> None:
        self._journal = journal
        self._lease_new = lease_new
        self.held: AbstractAsyncContextManager[object] | None = None
        self._created = journal.creating(self._first_append)
        self._recorder = recorder
        recorder.gather = self._until_go
        self._lease_cm = lease
        self._create = create
        self._go = anyio.Event()
        self._first: Sequence[Event] | None = None  # the first append's events
        self._claimed = False  # the first append's events came, or run made it without
        self._made = anyio.Event()
        self._offered = anyio.Event()
        self._entries: list[JournalEvent] = []
        self._errors: list[BaseException] = []  # the create's first
        self._follow_error: BaseException | None = None  # what followed the create failed
        self.done = anyio.Event()
        self.error: BaseException | None = None

    def go(self) -> None:
        """Let the create start now (calling it again does nothing)."""
        self._go.set()

    async def _until_go(self) -> None:
        # What is recorded until the request is sent joins the first append.
        with anyio.move_on_after(HOLD_S):
            await self._go.wait()
        self._recorder.gather = anyio.lowlevel.checkpoint
        await anyio.lowlevel.checkpoint()

    async def _first_append(self, events: Sequence[Event]) -> list[JournalEvent] | None:
        """Hand ``events`` to :meth:`run`, which makes the thread with them; return them
        journaled. None when it comes too late (the append then waits for the journal)."""
        if self._claimed:
            return None
        self._claimed, self._first = True, events
        self._offered.set()
        await self._made.wait()
        if self._errors:
            raise self._errors[0]
        if self._follow_error is not None:
            # The thread stands, with its first events; what followed them was not
            # journaled: the recorder stops (as for any failed append).
            raise self._follow_error
        return self._entries

    async def _make(self, events: Sequence[Event] | None) -> None:
        try:
            if events is None:
                await self._create()
            else:
                self._entries = await self._journal.create_with_events(events)
        except Exception as exc:  # noqa: BLE001 - the session's calls raise it
            self._errors.insert(0, exc)  # the create's error comes first

    async def run(self) -> ThreadLease | None:
        """Take the lease and make the thread once :meth:`go` was called or :data:`HOLD_S`
        passed (with the first append's events when the recorder has them); return the
        lease, or None when either failed (``error`` says why: the create's first,
        ``ThreadExistsError`` for a taken id). A thread whose lease was refused is made all
        the same, with nothing in it.

        Shielded: a lease taken is never lost to a cancellation (the store calls are
        bounded).
        """
        lease: ThreadLease | None = None
        try:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(HOLD_S):
                    await self._go.wait()
                if not self._claimed and self._recorder.held:  # its events are on their way
                    with anyio.move_on_after(HOLD_S):
                        await self._offered.wait()
                self._claimed = True
                if self._first and self._lease_new is not None:
                    # What the session records while the thread is made is journaled in
                    # the same store call (the model's first output, often): the first
                    # streamed token waits for no append of its own after the create.
                    follow_on = FollowOn()
                    if not self._recorder.follow(follow_on):
                        follow_on.close()
                    held = self._lease_new(self._first, follow_on=follow_on)
                    lease = await self._lease_and_make(held, follow_on)
                else:
                    lease = await self._lease_then_make()
        finally:
            if not self._errors and lease is None:  # not Exception: stopped from outside
                self._errors.append(StoppedError("the session closed before its thread was made"))
            self.error = self._errors[0] if self._errors else None
            self._created(self.error)
            self._made.set()
            self.done.set()
        return lease

    async def _lease_and_make(
        self, held: AbstractAsyncContextManager[LeasedThread], follow_on: FollowOn
    ) -> ThreadLease | None:
        """Take the lease and make the thread with its first events in one store call."""
        try:
            leased = await held.__aenter__()
        except Exception as exc:  # noqa: BLE001 - the session's calls raise it
            self._errors.append(exc)  # the lease's or the create's: nothing is held
            if isinstance(exc, ThreadBusyError):
                await self._make(None)  # made all the same, empty (or its create's error first)
            return None
        finally:
            follow_on.close()
        self.held, self._entries = held, leased.entries
        self._follow_error = follow_on.error
        return leased.lease

    async def _lease_then_make(self) -> ThreadLease | None:
        """Take the lease, then make the thread (with the first events when they came)."""
        lease: ThreadLease | None = None
        try:
            lease = await self._lease_cm.__aenter__()
        except Exception as exc:  # noqa: BLE001 - the session's calls raise it
            self._errors.append(exc)
        await self._make(self._first if lease is not None else None)
        if self._errors and lease is not None:
            await self._lease_cm.__aexit__(None, None, None)
            return None
        if lease is not None:
            self.held = self._lease_cm
        return lease


async def read_tail(
    journal: ThreadJournal, metadata: ThreadMetadata | None = None
) -> list[JournalEvent]:
    """Return the journal's events from its last ``TurnStarted`` on, and further back to the
    acceptance of each turn the metadata says is open (all when it has none of them).

    An open turn stops being looked for at its ``InputAccepted`` (not a steer), or at its
    ``TurnStarted`` when its input was journaled in it (a ``UserMessage``): what was
    accepted before that has started already.
    """
    if metadata is None:
        metadata = await journal.metadata()
    if not metadata.last_sequence:
        return []  # an empty journal (a new thread): nothing to page through
    looking = set(metadata.open_turns)
    answered: set[str] = set()
    found_start = False
    tail: list[JournalEvent] = []
    before: int | None = None
    while True:
        page = await journal.event_page(before=before, limit=_PAGE)
        for index in range(len(page.events) - 1, -1, -1):
            event = page.events[index].event
            if isinstance(event, TurnStarted):
                found_start = True
                if event.turn_id in answered:
                    looking.discard(event.turn_id)
            elif isinstance(event, InputAccepted) and not event.steer:
                looking.discard(event.turn_id)
            elif isinstance(event, ItemCompleted) and isinstance(event.item, UserMessage):
                answered.add(event.turn_id)
            if found_start and not looking:
                return [*page.events[index:], *tail]
        tail = [*page.events, *tail]
        if page.next_before is None:
            return tail
        before = page.next_before


def leftovers(tail: Sequence[Event]) -> tuple[str | None, list[str], list[tuple[str, str]]]:
    """Return the open turn of ``tail``, the input it took but never journaled, and the
    input accepted for later turns and never answered (``(turn_id, text)``)."""
    starts = [i for i, e in enumerate(tail) if isinstance(e, TurnStarted)]
    last = tail[starts[-1]].turn_id if starts else None
    since = tail[starts[-1] :] if starts else []
    ended = any(isinstance(e, (TurnComplete, TurnAborted)) and e.turn_id == last for e in since)
    pending: list[InputAccepted] = []
    for event in tail:
        if isinstance(event, InputAccepted):
            pending.append(event)
        elif isinstance(event, ItemCompleted) and isinstance(event.item, UserMessage):
            text = event.item.text
            for index, accepted in enumerate(pending):
                if accepted.turn_id == event.turn_id and accepted.text == text:
                    del pending[index]
                    break
    mine = [a.text for a in pending if a.turn_id == last]
    later = [(a.turn_id, a.text) for a in pending if a.turn_id != last]
    if ended:  # not left by a dead session: run it anew rather than lose it
        later = [(new_id("turn"), text) for text in mine] + later
        return None, [], later
    return last, mine, later


def partial_reply(tail: Sequence[Event], turn_id: str) -> str:
    """Return the reply text the open turn's last model step streamed (and the user saw)
    but never journaled as an item: what an interrupt would have kept."""
    step: str | None = None
    text = ""
    for event in tail:
        if getattr(event, "turn_id", None) != turn_id:
            continue
        if isinstance(event, ModelStepStarted):
            step, text = event.model_step_id, ""
        elif isinstance(event, AssistantContentDelta):
            if event.model_step_id == step and event.phase is ContentPhase.FINAL_ANSWER:
                text += event.delta
        elif isinstance(event, ItemCompleted) and isinstance(event.item, AssistantMessage):
            text = ""  # the step ended (or its partial text was kept): nothing is left
    return text


Leftover = tuple[str, str, PendingToolStep | None]
"""``(turn_id, text, resume)``: an input to run as a turn, or (``resume`` set) a turn a dead
session left in a tool step, to finish."""


async def find_leftovers(
    journal: ThreadJournal, recorder: EventRecorder, metadata: ThreadMetadata | None = None
) -> list[Leftover]:
    """Close a dead session's open turn (through ``recorder``); return what is left to do.

    An open turn whose last tool step has calls without results is not closed: it comes
    first, to be resumed (its calls run by the crash rules, then the turn goes on). Any
    other open turn is closed with the text its last model step streamed kept as an
    interrupted ``AssistantMessage`` (the interrupt rule), the input it had taken journaled
    into it, then ``TurnAborted(turn_id, "process_exited")``, by a conditional append on the last
    sequence read (read again when someone appended meanwhile). Then each input accepted
    for a later turn and never answered, in order.

    ``metadata``: the thread's metadata just read (its open turns) for the first read of
    the tail; a later try reads it again.
    """
    for _ in range(_TRIES):
        tail = await read_tail(journal, metadata)
        metadata = None  # read again on the next try
        open_turn, taken, later = leftovers([e.event for e in tail])
        pending: list[Leftover] = [(turn_id, text, None) for turn_id, text in later]
        if open_turn is None:
            return pending
        step = pending_tool_step(
            e.event for e in tail if getattr(e.event, "turn_id", None) == open_turn
        )
        if step is not None:
            # Steering the turn took and never journaled becomes turns of its own.
            again: list[Leftover] = [(new_id("turn"), t, None) for t in taken]
            return [(open_turn, "", step), *again, *pending]
        # A model step streams only after the turn's own input is journaled: with a partial
        # reply, what it took is steering, kept after it.
        partial = partial_reply([e.event for e in tail], open_turn)
        closing = turn_end(open_turn, AbortReason.PROCESS_EXITED, partial=partial, steering=taken)
        last = tail[-1].sequence if tail else 0
        try:
            await recorder.append_now(closing, expected_last_sequence=last)
        except SequenceConflictError:
            continue
        return pending
    raise SequenceConflictError.conditional(journal.thread_id, last, last + 1)
