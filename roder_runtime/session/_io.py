"""What a session's turns record through and read steering from.

:class:`RecorderSink` is the turn driver's :class:`~roder_runtime.turn._driver.TurnSink`
over the session's recorder: streamed text is admitted or refused at once, everything else
waits for room (and is never refused). :class:`RecordedJournal` is the thread journal a
turn's compaction appends to — through the recorder, in order with everything else.
:class:`TurnInbox` holds the running turn's steering.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import anyio

from roder_api.events import AssistantContentDelta, Event, JournalEvent
from roder_runtime.session._recorded import measure
from roder_runtime.session._recorder import EventRecorder
from roder_runtime.store._journal import ReplayHistory, ThreadJournal


class TurnInbox:
    """The running turn's steering; closed once the turn takes its last look at it."""

    def __init__(self, preempt: Callable[[], contextlib.AbstractContextManager[anyio.Event]]):
        self.texts: list[str] = []
        self.open = True
        self._preempt = preempt

    def take(self) -> list[str]:
        """Return (and remove) the steering texts that arrived, in order."""
        taken, self.texts = self.texts, []
        return taken

    def take_or_close(self) -> list[str]:
        """Return the steering that arrived; when there is none, accept no more."""
        if not self.texts:
            self.open = False
        return self.take()

    def close(self) -> list[str]:
        """Accept no more steering; return what arrived and was not taken."""
        self.open = False
        return self.take()

    def preempt(self) -> contextlib.AbstractContextManager[anyio.Event]:
        """Return a block during which a ``Steer`` sets the yielded event."""
        return self._preempt()


class RecordedJournal:
    """The thread's journal for a turn: appends go through the recorder, in order."""

    def __init__(self, journal: ThreadJournal, recorder: EventRecorder) -> None:
        self.thread_id = journal.thread_id
        self.store_name = journal.store_name
        self._journal = journal
        self._recorder = recorder

    async def append(
        self, events: Sequence[Event], *, expected_last_sequence: int | None = None
    ) -> list[JournalEvent]:
        """Append now, after everything recorded before (conditionally when asked)."""
        return await self._recorder.append_now(
            events, expected_last_sequence=expected_last_sequence
        )

    async def read_events(self, *, after: int = 0) -> list[JournalEvent]:
        """Return the thread's events with sequence above ``after``."""
        return await self._journal.read_events(after=after)

    async def replay_history(self) -> ReplayHistory:
        """Return the transcript items from the last compaction boundary on."""
        return await self._journal.replay_history()

    async def last_sequence(self) -> int:
        """Return the sequence of the thread's last event."""
        return await self._journal.last_sequence()


class RecorderSink:
    """A turn's events into the session's recorder; ``closing`` once the consumer is gone."""

    def __init__(self, journal: ThreadJournal, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self.closing = False
        self._journal = RecordedJournal(journal, recorder)

    @property
    def journal(self) -> RecordedJournal:
        """Return the thread's journal, appending in order with the recorder."""
        return self._journal

    def stream(self, event: AssistantContentDelta) -> None:
        """Record streamed text now, or raise ``RecorderFullError``."""
        self.recorder.record(event)

    async def record(self, *events: Event) -> None:
        """Record events that must not be lost, waiting for room when the queue is full.

        The events are recorded together (one batch, so one atomic append when nothing else
        is queued) once there is room for all of them. Room comes from the consumer (or,
        once closing, from persisting alone).
        """
        measured = [measure(event) for event in events]  # each event's one encoding
        size = sum(size for size, _ in measured)
        while not self.recorder.has_room(len(events), size) and self.recorder.held:
            if self.closing:
                await self.recorder.wait_persisted()
            else:
                await self.recorder.flush()
        for event, measure_of in zip(events, measured, strict=True):
            self.recorder.record(event, room_checked=True, measured=measure_of)

    async def persisted(self) -> None:
        """Wait until everything recorded so far is persisted."""
        await self.recorder.wait_persisted()
