"""In-turn native compaction: a boundary streamed by ``stream_turn``, staged with its step.

Providers compact inside a normal turn (the OpenAI Responses API's ``context_management``,
Anthropic's ``context_management.edits``): the engine yields the boundary from
``stream_turn`` as a ``ProviderMetadata``. The turn driver hands it to a :class:`StagedBoundary`
(one per model step), which never journals it as it streams. When the step ends with
``Completed`` the boundary commits with the step's items in **one conditional append**:
``ItemCompleted(boundary)``, ``CompactionCommitted``, then the step's reply and calls — so
the boundary comes before them in the journal and they stay in replay. Every other ending
discards it with ``CompactionDiscarded(reason)``; the history is then exactly as it was.

The conditional append expects the journal to end where this turn left it: before the
commit the events since the turn's mark are read back; a transcript item of another turn
means someone appended meanwhile, and the candidate is discarded (``conflict``) rather
than committed over items it has not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

import anyio

from roder_api.errors import SequenceConflictError
from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionMode,
    CompactionStarted,
    DiscardReason,
    Event,
    ItemCompleted,
    JournalEvent,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_runtime.model._call import Attempt, PreemptSignal
from roder_runtime.store._journal import Journal
from roder_runtime.turn._seams import TurnSink

COMMIT_TRIES = 3
"""How often a commit is tried again when only this turn's own events moved the journal."""


def is_boundary(event: object) -> TypeGuard[ProviderMetadata]:
    """Return True for an engine event that is a native compaction boundary."""
    return isinstance(event, ProviderMetadata) and is_compaction_boundary(event)


def _identity(boundary: ProviderMetadata) -> Any:
    """Return what tells two boundaries apart: their compaction items' ids, else the data."""
    output = boundary.data.get("output")
    ids = [
        entry.get("id")
        for entry in (output if isinstance(output, list) else [])
        if isinstance(entry, dict) and entry.get("id")
    ]
    return tuple(ids) if ids else repr(sorted(boundary.data.items(), key=lambda kv: kv[0]))


class StagedBoundary:
    """The boundary of one model call, staged until its step ends.

    ``staged`` is set once a boundary arrived (the step is then preemptible by a steer);
    ``conflicting`` once a second, different boundary arrived. One per model call: an
    attempt that staged a boundary produced output, so it is the call's last.
    """

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.boundary: ProviderMetadata | None = None
        self.conflicting = False
        self.settled = False
        self.staged = anyio.Event()

    @property
    def pending(self) -> bool:
        """Return True while a boundary is staged and neither committed nor discarded."""
        return self.boundary is not None and not self.settled

    def stage(self, boundary: ProviderMetadata) -> list[Event]:
        """Stage ``boundary``; return the events to journal now (``CompactionStarted``)."""
        if self.boundary is None:
            self.boundary = boundary
            self.staged.set()
            return [CompactionStarted(self.turn_id, CompactionMode.NATIVE)]
        if _identity(boundary) != _identity(self.boundary):
            self.conflicting = True  # the same boundary repeated is fine; another is not
        return []

    def discard(self, reason: DiscardReason) -> list[Event]:
        """Return the events that discard the staged boundary (none when nothing is staged)."""
        if not self.pending:
            return []
        self.settled = True
        return [CompactionDiscarded(reason, self.turn_id)]

    def commit_events(self) -> list[Event]:
        """Return the events that commit the boundary (they go first in the step's batch)."""
        assert self.boundary is not None
        return [
            ItemCompleted(self.turn_id, self.boundary),
            CompactionCommitted(self.turn_id, CompactionMode.NATIVE),
        ]


class PreemptWhileStaged:
    """A preempt signal for a model call: set once a steer came *and* a boundary is staged.

    ``steer`` is the event a ``Steer`` sets (the session's preempt block); ``staged`` the
    call's :class:`StagedBoundary`.
    """

    def __init__(self, steer: Any, staged: StagedBoundary) -> None:
        self._steer = steer
        self._staged = staged

    def is_set(self) -> bool:
        """Return True when the call holds a boundary and a steer arrived."""
        return self._staged.pending and bool(self._steer.is_set())

    async def wait(self) -> None:
        """Return once both happened."""
        await self._staged.staged.wait()
        await self._steer.wait()


def _foreign(entries: Sequence[JournalEvent], turn_id: str) -> JournalEvent | None:
    """Return the first transcript item another turn (or a script) appended, if any.

    Events that are not items (input accepted for a later turn, warnings, usage) do not
    change the history the boundary stands for.
    """
    for entry in entries:
        if isinstance(entry.event, ItemCompleted) and entry.event.turn_id != turn_id:
            return entry
    return None


async def commit_step(
    journal: Journal,
    staged: StagedBoundary,
    mark: int,
    step_events: Sequence[Event],
) -> list[JournalEvent] | None:
    """Commit the staged boundary with ``step_events`` in one conditional append.

    ``mark`` is the journal's last sequence when the step's transcript was read. Return
    the journaled entries, or None when someone else appended since (the caller discards
    the boundary as ``conflict`` and journals the step without it).
    """
    events = [*staged.commit_events(), *step_events]
    for _ in range(COMMIT_TRIES):
        since = await journal.read_events(after=mark)
        if _foreign(since, staged.turn_id) is not None:
            return None
        expected = since[-1].sequence if since else mark
        try:
            entries = await journal.append(events, expected_last_sequence=expected)
        except SequenceConflictError:
            continue  # our own events (a steer's input) moved it; look again
        staged.settled = True
        return entries
    return None


class InTurnCompaction:
    """The in-turn compaction of one turn: what the turn driver asks at each of its seams.

    Made for an engine with native compaction once the turn read its history (for any
    other engine only when it streams a boundary). It keeps the journal's mark (the sequence
    that history was read at), the staged boundary of the model call running now, and why
    one left staged at the end is discarded.
    """

    def __init__(self, turn_id: str, sink: TurnSink, journal: Journal, mark: int) -> None:
        self.turn_id = turn_id
        self.sink = sink
        self.journal = journal
        self.mark = mark
        self.current = StagedBoundary(turn_id)
        self.reason = DiscardReason.INTERRUPTED

    def call(self, steer: Any) -> PreemptSignal:
        """Begin a model call (nothing staged); return its preempt signal: a steer counts
        once a boundary is staged."""
        self.current = StagedBoundary(self.turn_id)
        return PreemptWhileStaged(steer, self.current)

    async def stage(self, boundary: ProviderMetadata) -> None:
        """Stage a boundary the step streamed (journaling ``CompactionStarted`` once)."""
        started = self.current.stage(boundary)
        if started:
            await self.sink.record(*started)

    def ended(self, attempt: Attempt, failed: bool, completed: bool) -> bool:
        """Note how the model call ended; return True when a steer preempted the step."""
        if attempt.preempted and self.current.pending:
            return True
        if attempt.failure is not None:
            self.reason = DiscardReason.DISCONNECTED
        elif failed or attempt.error is not None:
            self.reason = DiscardReason.FAILED
        elif not completed:
            self.reason = DiscardReason.NOT_COMPLETED
        else:
            self.reason = DiscardReason.INTERRUPTED  # from here on only an abort ends it
        return False

    def discard_staged(self) -> list[Event]:
        """Return the discard of a boundary still staged as the turn ends (else nothing)."""
        return self.current.discard(self.reason)

    async def preempted(self, partial: str, steering: Sequence[str]) -> list[TranscriptItem]:
        """Journal a preempted step: the boundary discarded, the partial text and the
        steering kept; return what joins the history for the next model step."""
        added: list[TranscriptItem] = [AssistantMessage(partial, True)] if partial else []
        added += [UserMessage(text) for text in steering]
        await self.sink.record(
            *self.current.discard(DiscardReason.PREEMPTED),
            *(ItemCompleted(self.turn_id, item) for item in added),
        )
        return added

    async def finish(self, events: Sequence[Event]) -> None:
        """Journal a completed step's events, its staged boundary committed first (one
        conditional append) — or discarded when it conflicts or someone appended since."""
        staged = self.current
        if not staged.pending:
            await self.sink.record(*events)
            return
        if staged.conflicting:
            await self.sink.record(*staged.discard(DiscardReason.CONFLICTING_BOUNDARY), *events)
            return
        await self.sink.persisted()
        entries = await commit_step(self.journal, staged, self.mark, events)
        if entries is None:
            await self.sink.record(*staged.discard(DiscardReason.CONFLICT), *events)
            return
        self.mark = entries[-1].sequence
