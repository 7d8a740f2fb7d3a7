"""A session's plugin-facing ops, and following its journal.

A process that cannot take a thread's lease (another holds it) still accepts input: it
journals ``InputAccepted`` without the lease (appends never need it), and approval
decisions as ``ToolApprovalDecided``. The lease holder's session, started with
``follow_journal=True``, waits for new events with ``ThreadStore.wait_for_events`` and
answers that input in journal order, and hands a decision to the call that waits for it.
:class:`JournalFollowing` is the part of :class:`~roder_runtime.session._session.Session` that
does it, with the ops plugins call without importing the op classes (``submit_input``,
``decide_tool_call``, ``interrupt``, ``running_turn_id``, ``compaction_preempt``), and the
session's delivery (``next_event``, ``stop_delivery``, ``flush``).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from roder_api.events import AbortReason, InputAccepted, JournalEvent, ToolApprovalDecided
from roder_api.inference import ToolSpec
from roder_api.transcript import ToolResultRecord
from roder_runtime.session._ops import Op, Steer, UserInput
from roder_runtime.tools._tool_step import ApproveToolCall, JournaledApproval
from roder_runtime.turn._edges import SubmittedInput

if TYPE_CHECKING:
    from roder_runtime.session._recorder import EventRecorder
    from roder_runtime.session._tools import SessionTools
    from roder_runtime.store._journal import ThreadJournal
    from roder_runtime.turn._driver import TurnDriver

_WAIT_S = 5.0
"""How long one wait for new events lasts (then it is renewed; closing ends it sooner)."""
_RETRY_S = 1.0
"""The pause after the store failed to answer, before following again."""
LOCAL_S = 0.25
"""How long after an append here the follower waits for the next one to be handed over
before it asks the store (``wait_for_events``, a store call per wake)."""
_HANDED = 4096
"""How many appended entries a following session holds until it takes them (past it the
oldest go, and it reads them back from the store)."""


class JournalFollowing:
    """What a session adds for plugins and for following its journal (a mixin)."""

    thread_id: str
    journal: ThreadJournal
    recorder: EventRecorder
    tools: SessionTools
    _turn: TurnDriver | None
    _queue: deque[SubmittedInput]
    _queue_signal: anyio.Event
    _closing: bool
    _preempt: anyio.Event | None

    def submit(self, op: Op, *, turn_id: str | None = None) -> Awaitable[str | None]:
        """Submit an op (the session's)."""
        raise NotImplementedError

    def _init_following(self, follow: bool) -> None:
        self._follow = follow
        self._own_turns: set[str] = set()  # the inputs this session queued, by turn id
        self._followed = 0  # the last sequence the follower read
        self._follow_scope = anyio.CancelScope()

    def _start_following(self, task_group: anyio.abc.TaskGroup, after: int) -> None:
        if self._follow:
            self._followed = after
            task_group.start_soon(self._follow_journal, after)

    async def _take_unread_input(self) -> None:
        """Queue the input other processes journaled that the follower has not read yet.

        Called before every input is queued or started here: input accepted elsewhere
        before it (its ``InputAccepted`` already journaled, its 202 perhaps already
        answered) goes first, as the follower would have queued it. Taking it twice is harmless
        (:meth:`take_journaled_input` skips what is this session's already).
        """
        if self._follow and not self.journal.being_created:  # (new: nobody knew it)
            for entry in await self.journal.read_events(after=self._followed):
                event = entry.event
                if isinstance(event, InputAccepted) and not event.steer:
                    self.take_journaled_input(event.turn_id, event.text)

    # --- events ----------------------------------------------------------------------------

    async def next_event(self) -> JournalEvent:
        """Return the next event, already persisted; raise ``RecorderError`` when persisting
        failed (its message names the store) and ``StoppedError`` once closed."""
        return await self.recorder.next_event()

    def stop_delivery(self) -> None:
        """Deliver nothing more through :meth:`next_event`: what is recorded is still
        persisted, and read from the journal instead (``roder serve``'s streams). The
        recorder then never waits for a consumer, and none has to drain it; what waited
        for one is dropped (it is in the journal). ``next_event`` raises ``StoppedError``
        once the session closes."""
        self.recorder.discard_undelivered()

    async def flush(self) -> None:
        """Wait until every event recorded so far is persisted and delivered; raise
        ``RecorderError`` (the store's error as ``__cause__``) when persisting failed."""
        await self.recorder.flush()

    @property
    def running_turn_id(self) -> str | None:
        """Return the id of the turn running now, or None."""
        turn = self._turn
        return turn.turn_id if turn is not None and not turn.finished else None

    def interrupt(self, turn_id: str) -> None:
        """Stop turn ``turn_id`` now (running or queued); do nothing for any other id."""
        turn = self._turn
        if turn is not None and turn.turn_id == turn_id:
            turn.abort(AbortReason.INTERRUPTED)
            return
        for queued in self._queue:
            if queued.turn_id == turn_id:
                queued.interrupted = True

    @contextlib.contextmanager
    def compaction_preempt(self) -> Iterator[anyio.Event]:
        """Return an event that a ``Steer`` sets while this block runs (give it to
        ``Runtime.compact_with_provider(..., preempt=event)``: steering discards it)."""
        event = anyio.Event()
        previous, self._preempt = self._preempt, event
        try:
            yield event
        finally:
            self._preempt = previous

    @property
    def idle(self) -> bool:
        """Return True when no turn runs, none is queued and every event is delivered, or
        once nothing more can happen (its recorder failed: ``submit`` raises why)."""
        if self.recorder.failure is not None:
            return True
        return self._turn is None and not self._queue and self.recorder.held == 0

    async def submit_input(
        self,
        text: str,
        *,
        turn_id: str | None = None,
        steer: bool = False,
        client_tools: Sequence[ToolSpec] = (),
        tool_results: Sequence[ToolResultRecord] = (),
        instructions: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Submit ``text`` as a :class:`UserInput` (``steer``: a :class:`Steer`); return the
        turn id it goes to. For callers that cannot import the op classes (plugins).
        ``client_tools``, ``tool_results``, ``instructions`` and ``metadata`` as for
        :class:`UserInput`."""
        op: Op = (
            Steer(text)
            if steer
            else UserInput(text, (*client_tools,), (*tool_results,), instructions, metadata)
        )
        if turn_id is not None:
            self._own_turns.add(turn_id)
        result = await self.submit(op, turn_id=turn_id)
        assert result is not None  # an input always goes to a turn
        return result

    def decide_tool_call(self, call_id: str, approved: bool, reason: str | None = None) -> None:
        """Submit an :class:`ApproveToolCall` decision (for plugins, like ``submit_input``)."""
        self.tools.decide_call(ApproveToolCall(call_id, approved, reason))

    def take_journaled_input(self, turn_id: str, text: str) -> bool:
        """Queue an input someone else journaled (``InputAccepted``) as a turn here.

        Return False (doing nothing) when it is this session's already. Another process
        accepted it without the lease; the lease holder answers it, in order.
        """
        if turn_id in self._own_turns or self._closing:
            return False
        self._own_turns.add(turn_id)
        self._queue.append(SubmittedInput(turn_id, text, accepted=True))
        self._queue_signal.set()
        return True

    def take_journaled_decision(self, decided: ToolApprovalDecided) -> None:
        """Hand a decision someone else journaled to the call of this session that waits
        for it, which does not journal it again (nothing when none waits: the call was
        decided here)."""
        if self.tools.waiting_for(decided.call_id):
            self.tools.decide_call(
                JournaledApproval(decided.call_id, decided.approved, decided.reason)
            )

    async def _follow_journal(self, after: int) -> None:
        # Until the session closes (it cancels the scope): take what others journaled.
        # Appends made in this process (this session's own, mostly) are handed over when
        # durable (AppendWakeups.listen), so they are not read back; any gap is read. While
        # the thread is busy here the follower waits for the next hand-over (up to
        # LOCAL_S) instead of asking the store after each one: the order of input across
        # processes does not hang on how soon it asks, as every submit first takes the
        # input journaled elsewhere that it has not read (_take_unread_input).
        journal = self.journal
        handed = _Handed()
        # Opened to answer input submitted here: its appends are handed over first (from
        # before a new thread is made: none is missed). Input journaled elsewhere meanwhile
        # is taken by that submit, or polled LOCAL_S later.
        handed.local_at = anyio.current_time()
        forget = journal.store.append_wakeups.listen(self.thread_id, handed)
        try:
            try:
                await journal.created()  # a thread being created: followed once it is
            except Exception:  # noqa: BLE001 - the session's calls raise it
                return
            after = max(after, journal.made_through)  # this session's own first events
            with self._follow_scope:
                while True:
                    try:
                        if handed.entries and handed.entries[-1].sequence > after:
                            last = handed.entries[-1].sequence  # handed over: no store call
                        elif anyio.current_time() - handed.local_at < LOCAL_S:
                            # Busy here: the next append is handed over; no store call.
                            handed.wake = anyio.Event()
                            with anyio.move_on_after(LOCAL_S):
                                await handed.wake.wait()
                            continue
                        else:
                            last = await journal.store.wait_for_events(
                                self.thread_id, after, _WAIT_S
                            )
                        if last <= after:
                            continue
                        entries = _contiguous(handed.entries, after, last)
                        if entries is None:
                            entries = await journal.read_events(after=after)
                    except Exception:  # noqa: BLE001 - a store hiccup: the turns report theirs
                        await anyio.sleep(_RETRY_S)
                        continue
                    for entry in entries:
                        event = entry.event
                        if isinstance(event, InputAccepted) and not event.steer:
                            self.take_journaled_input(event.turn_id, event.text)
                        elif isinstance(event, ToolApprovalDecided):
                            self.take_journaled_decision(event)
                        after = self._followed = entry.sequence
        finally:
            forget()


class _Handed:
    """What the follower is handed: appended entries in order (the oldest go past
    :data:`_HANDED`), ``wake`` set at each hand-over, ``local_at`` the time of the last."""

    __slots__ = ("entries", "local_at", "wake")

    def __init__(self) -> None:
        self.entries: deque[JournalEvent] = deque(maxlen=_HANDED)
        self.wake = anyio.Event()
        self.local_at = -LOCAL_S

    def __call__(self, entries: Sequence[JournalEvent]) -> None:
        self.entries.extend(entries)
        self.local_at = anyio.current_time()
        self.wake.set()


def _contiguous(handed: deque[JournalEvent], after: int, last: int) -> list[JournalEvent] | None:
    """Take the handed-over entries ``after + 1 .. last`` (dropping older ones); None when
    they are not all there in order (read the journal instead)."""
    while handed and handed[0].sequence <= after:
        handed.popleft()
    if not handed or handed[0].sequence != after + 1:
        return None
    taken: list[JournalEvent] = []
    while handed and handed[0].sequence <= last:
        entry = handed.popleft()
        if entry.sequence != after + 1 + len(taken):
            return None
        taken.append(entry)
    return taken if taken and taken[-1].sequence == last else None
