"""The durable event recorder: persist every event before it is delivered, bounded, in order.

A session records its events here. The recorder

- accepts an event synchronously (:meth:`EventRecorder.record`) or refuses it with
  ``RecorderFullError("event recorder queue is full")`` when its queue is full by count or
  by bytes; everything accepted before a refusal is still persisted and delivered, in order;
- persists accepted events in the background, batching what has queued up into one
  ``append_events`` call (one durable write), and only then hands them to the consumer;
- coalesces consecutive text deltas of one stream (turn, model step, phase) up to
  :data:`COALESCE_BYTES` or :data:`COALESCE_SECONDS`: the first delta of a stream is queued at
  once, later ones wait in a pending batch that any other event, a phase or step change, a
  full batch or a timer flushes first; a delta is never split and one larger than the limit
  passes whole;
- lets the tasks that are ready record before it takes a batch (one pass of the event
  loop), so events recorded back to back share one append (one sync);
- while a new thread is made with its first batch, offers what is recorded meanwhile to
  that store call (:meth:`EventRecorder.follow`, a ``FollowOn``): it is journaled in the
  same worker call, after the batch, not in an append after it returns;
- appends a batch of its caller's at once, in order with everything recorded before it and
  conditionally if asked (:meth:`EventRecorder.append_now`: a compaction's commit, closing
  a dead turn), and delivers it like any other;
- encodes each event once: the bytes it counts against its budget are the bytes the store
  writes (:class:`~roder_api.storekit.EncodedEvents`; a (merged) delta when persisted);
- stops for good when persisting fails: nothing more is delivered, and ``flush()``,
  ``next_event()`` and ``record()`` raise a ``RecorderError`` whose ``__cause__`` is the
  store's error.

The queue bound covers every event from acceptance to delivery, so a slow consumer cannot
make it grow without limit; :meth:`EventRecorder.flush` waits until the consumer has taken
everything recorded before it (backpressure).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio
import anyio.lowlevel

from roder_api.codec import dumps
from roder_api.errors import RecorderError, RecorderFullError, SequenceConflictError, StoppedError
from roder_api.events import AssistantContentDelta, Event, JournalEvent
from roder_api.storekit import EncodedEvents, FollowOn
from roder_runtime.session._recorded import (
    DELTA_OVERHEAD,
    Counters,
    Measured,
    Pending,
    Queued,
    Signal,
    StreamKey,
    encoded,
    measure,
)

COALESCE_BYTES = 16 * 1024
"""The most UTF-8 bytes of text merged into one delivered delta."""

COALESCE_SECONDS = 0.040
"""How long a pending batch of text waits for more before it is persisted."""

QUEUE_FULL = "event recorder queue is full"
"""The message of the ``RecorderFullError`` a full recorder refuses an event with."""


_ONE_PASS = anyio.lowlevel.checkpoint
"""The default ``EventRecorder.gather``: one pass of the event loop."""


class Append(Protocol):
    """Append events to the thread's journal as one atomic, durable batch."""

    async def __call__(
        self, events: Sequence[Event], *, expected_last_sequence: int | None = None
    ) -> list[JournalEvent]:
        """Return the events as journaled (conditionally on ``expected_last_sequence``)."""
        ...


class EventRecorder:
    """Persists events to a journal before delivering them; bounded by count and bytes.

    ``append`` persists a batch (``Runtime.append_events`` bound to a thread). Run
    :meth:`run` in a task group for the recorder's lifetime; :meth:`close` ends it once
    everything accepted is persisted.
    """

    def __init__(
        self,
        append: Append,
        *,
        event_capacity: int,
        byte_budget: int,
        coalesce_bytes: int = COALESCE_BYTES,
        coalesce_seconds: float = COALESCE_SECONDS,
    ) -> None:
        if event_capacity < 1 or byte_budget < 1:
            raise ValueError("the recorder needs room for at least one event and one byte")
        self._append = append
        self.event_capacity = event_capacity
        self.byte_budget = byte_budget
        self.coalesce_bytes = coalesce_bytes
        self.coalesce_seconds = coalesce_seconds
        self._to_persist: deque[Queued] = deque()
        self._follow: FollowOn | None = None  # takes what is queued while it accepts
        self._followed: list[Queued] | None = None  # what it took (while a batch persists)
        self._to_deliver: deque[tuple[JournalEvent, int]] = deque()
        self._pending: Pending | None = None
        self._last_stream: StreamKey | None = None
        self._n = Counters()
        self._failure: BaseException | None = None
        self._closing = False
        self._finished = False
        self._discard_undelivered = False
        self._writer_wake = Signal()
        self._progress = Signal()
        self._append_lock = anyio.Lock()
        self.batches = 0
        """How many ``append`` calls persisted events (for benchmarks and tests)."""
        self.gather: Callable[[], Awaitable[None]] = _ONE_PASS
        """Awaited before a batch is taken, so that what is recorded meanwhile joins it
        (by default one pass of the event loop, skipped when text ends the batch)."""

    # --- accepting --------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        """Return the error that stopped the recorder, or None while it works."""
        return self._failure

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._stopped_error()
        if self._closing:
            raise StoppedError("the event recorder is closed")

    def _stopped_error(self) -> RecorderError:
        error = RecorderError(f"event recorder stopped: {self._failure}")
        error.__cause__ = self._failure
        return error

    @property
    def held(self) -> int:
        """Return how many events are held between acceptance and delivery."""
        return self._n.count

    def has_room(self, count: int = 1, size: int = 0) -> bool:
        """Return True when ``count`` more events of ``size`` bytes in all would be accepted.

        An event larger than the whole byte budget is accepted only into an empty recorder
        (memory stays bounded by the budget or that one event), so it can never be stuck.
        """
        if self._n.count + count > self.event_capacity:
            return False
        return self._n.size + size <= self.byte_budget or self._n.count == 0

    def record(
        self, event: Event, *, room_checked: bool = False, measured: Measured | None = None
    ) -> None:
        """Accept ``event`` for persisting and delivery, or refuse it.

        Raised ``RecorderFullError("event recorder queue is full")`` when the queue is full
        by count or by bytes (nothing of ``event`` is kept); ``RecorderError`` (with the
        store's error as ``__cause__``) after a failure; ``StoppedError`` once closed.
        ``room_checked``: the caller made sure of room with :meth:`has_room` for a group of
        events it records together, so none of them is refused. ``measured``: what
        :func:`measure` returned for ``event`` (so the caller's encoding is the one persisted).
        """
        self._check_open()
        if isinstance(event, AssistantContentDelta):
            self._record_delta(event, room_checked)
            return
        size, payload = measured if measured is not None else measure(event)
        if not room_checked and not self.has_room(1, size):
            raise RecorderFullError(QUEUE_FULL)
        self._flush_pending()
        self._last_stream = None
        self._enqueue(event, size, payload)

    def _record_delta(self, event: AssistantContentDelta, room_checked: bool) -> None:
        key: StreamKey = (event.turn_id, event.model_step_id, event.phase)
        text_bytes = len(event.delta.encode("utf-8"))
        size = text_bytes + len(event.turn_id) + len(event.model_step_id) + DELTA_OVERHEAD
        pending = self._pending
        if (
            pending is not None
            and pending.key == key
            and pending.text_bytes + text_bytes <= self.coalesce_bytes
        ):
            # Merged text costs only its own bytes: the envelope is already counted.
            if not room_checked and not self.has_room(0, text_bytes):
                raise RecorderFullError(QUEUE_FULL)
            pending.parts.append(event.delta)
            pending.text_bytes += text_bytes
            pending.size += text_bytes
            self._n.size += text_bytes
            return
        if not room_checked and not self.has_room(1, size):
            raise RecorderFullError(QUEUE_FULL)
        self._flush_pending()
        if key != self._last_stream or text_bytes > self.coalesce_bytes:
            # The first delta of a stream goes out at once; an oversized one passes whole.
            self._last_stream = key
            self._enqueue(event, size, None)
            return
        self._pending = Pending(
            key, [event.delta], text_bytes, size, anyio.current_time() + self.coalesce_seconds
        )
        self._n.count += 1
        self._n.size += size
        self._writer_wake.notify()

    def _enqueue(self, event: Event, size: int, payload: bytes | None) -> None:
        self._queue((event, size, payload))
        self._n.count += 1
        self._n.size += size
        self._n.queued += 1
        self._writer_wake.notify()

    def _flush_pending(self) -> None:
        """Move the pending text into the persist queue (already counted)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._queue((pending.event(), pending.size, None))
            self._n.queued += 1
            self._writer_wake.notify()

    def _queue(self, item: Queued) -> None:
        follow = self._follow
        if follow is not None and self._followed is not None:
            if follow.offer(item[0], item[2]):
                self._followed.append(item)  # journaled with the batch being persisted
                return
            self._follow = None  # refused once: everything after goes the usual way
        self._to_persist.append(item)

    def follow(self, follow_on: FollowOn) -> bool:
        """Offer what is queued, and what is recorded next, to ``follow_on`` while the batch
        being persisted is with the store (a new thread's create: ``NewThread``), until it
        refuses one; what it takes is journaled after that batch, in the same store call,
        and delivered with it. False (nothing offered) when no batch is being persisted.
        """
        if self._followed is None or self._failure is not None:
            return False
        self._follow = follow_on
        queued, self._to_persist = self._to_persist, deque()
        for item in queued:
            self._queue(item)
        return True

    # --- persisting -------------------------------------------------------------------------

    async def run(self) -> None:
        """Persist accepted events in batches until closed and drained, or a failure."""
        try:
            while self._failure is None:
                pending = self._pending
                if pending is not None and anyio.current_time() >= pending.deadline:
                    self._flush_pending()
                if self._to_persist:
                    # One pass of the event loop first (``gather``): what the tasks ready
                    # now record joins this batch (a tool step's calls and their
                    # ToolCallStarted share one sync instead of two back to back). Not
                    # when text ends the batch: a reader waits for it (a stream's first
                    # token), and the text after it is merged into later deltas anyway.
                    text_last = type(self._to_persist[-1][0]) is AssistantContentDelta
                    if not text_last or self.gather is not _ONE_PASS:
                        await self.gather()
                    async with self._append_lock:
                        await self._persist_batch()
                    if self._failure is not None:
                        return
                    continue
                if self._closing and self._pending is None:
                    return
                if pending is not None:
                    with anyio.move_on_after(max(0.0, pending.deadline - anyio.current_time())):
                        await self._writer_wake.wait()
                else:
                    await self._writer_wake.wait()
        finally:
            self._finished = True
            self._progress.notify()

    async def _persist_batch(self) -> None:
        batch = list(self._to_persist)
        self._to_persist.clear()
        followed: list[Queued] = []  # what a FollowOn (``follow``) takes meanwhile
        self._followed = followed
        try:
            try:
                entries = await self._append(encoded(batch))
            finally:
                self._follow = self._followed = None
            # The store journals what a FollowOn took (all it was offered) or none of it (a
            # store without the one-call path): what it did not take goes next, first.
            took = len(entries) - len(batch)
            if took in (0, len(followed)):
                self._to_persist.extendleft(reversed(followed[took:]))
                batch += followed[:took]
            else:
                raise RecorderError(
                    f"the store journaled {len(entries)} of {len(batch)} events of a batch"
                )
        except Exception as exc:
            self._fail(exc)
            return
        except BaseException:
            # Cancelled mid-append: whether the batch landed is unknown, so nothing more
            # may be delivered.
            self._fail(RecorderError("the event recorder was cancelled while persisting"))
            raise
        self.batches += 1
        self._n.persisted += len(batch)
        if self._failure is not None:
            return  # stopped meanwhile: nothing more is delivered
        if self._discard_undelivered:
            self._release(sum(size for _, size, _ in batch), len(batch))
            self._n.delivered += len(batch)
        else:
            for entry, (_, size, _) in zip(entries, batch, strict=True):
                self._to_deliver.append((entry, size))
        self._progress.notify()

    async def append_now(
        self, events: Sequence[Event], *, expected_last_sequence: int | None = None
    ) -> list[JournalEvent]:
        """Append ``events`` now, after everything recorded before; deliver them; return them.

        With ``expected_last_sequence`` the append is conditional: ``SequenceConflictError``
        (nothing written, the recorder goes on) when the journal's last event is another.
        Any other failure stops the recorder, as for its own batches.

        The append is shielded from the caller's cancellation (an interrupt of the turn
        that asked for it): once handed to the store, whether a batch landed must be known,
        so it is waited for (``append`` has its own deadline) and delivered; the
        cancellation then takes effect at the caller's next checkpoint.
        """
        self._check_open()
        with anyio.CancelScope(shield=True):
            entries = await self._append_now(events, expected_last_sequence)
        return entries

    async def _append_now(
        self, events: Sequence[Event], expected_last_sequence: int | None
    ) -> list[JournalEvent]:
        async with self._append_lock:
            self._flush_pending()
            if self._to_persist:
                await self._persist_batch()
            if self._failure is not None:
                raise self._stopped_error()
            try:
                batch = EncodedEvents(events, [dumps(event) for event in events])
                entries = await self._append(batch, expected_last_sequence=expected_last_sequence)
            except SequenceConflictError:
                raise
            except Exception as exc:
                self._fail(exc)
                raise self._stopped_error() from exc
            except BaseException:
                self._fail(RecorderError("the event recorder was cancelled while persisting"))
                raise
            self.batches += 1
            sizes = [
                measure(event)[0] if isinstance(event, AssistantContentDelta) else len(payload)
                for event, payload in zip(events, batch.payloads, strict=True)
            ]
            self._n.count += len(entries)
            self._n.size += sum(sizes)
            self._n.queued += len(entries)
            self._n.persisted += len(entries)
            self._last_stream = None
            if self._discard_undelivered:
                self._release(sum(sizes), len(entries))
                self._n.delivered += len(entries)
            else:
                self._to_deliver.extend(zip(entries, sizes, strict=True))
            self._progress.notify()
            return entries

    def fail(self, exc: BaseException) -> None:
        """Stop the recorder because of ``exc``: nothing more is accepted or delivered."""
        self._fail(exc)
        self._writer_wake.notify()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        lost = len(self._to_persist) + len(self._to_deliver) + (1 if self._pending else 0)
        self._to_persist.clear()
        self._to_deliver.clear()
        self._pending = None
        self._n.count -= lost
        self._n.count = max(0, self._n.count)
        self._n.size = 0
        self._progress.notify()

    def _release(self, size: int, count: int = 1) -> None:
        self._n.count -= count
        self._n.size -= size

    # --- delivering -------------------------------------------------------------------------

    async def next_event(self) -> JournalEvent:
        """Return the next persisted event, waiting for one.

        Raised ``RecorderError`` after a failure to persist (nothing more is delivered) and
        ``StoppedError`` when the recorder is closed and everything was delivered.
        """
        while True:
            if self._failure is not None:
                raise self._stopped_error()
            if self._to_deliver:
                entry, size = self._to_deliver.popleft()
                self._release(size)
                self._n.delivered += 1
                self._progress.notify()
                return entry
            if self._finished or (self._closing and self._discard_undelivered):
                raise StoppedError("the session is closed and every event was delivered")
            await self._progress.wait()

    async def flush(self) -> None:
        """Wait until every event recorded so far is persisted and delivered.

        Pending text is persisted at once. Raised ``RecorderError`` (with the store's error
        as ``__cause__``) when persisting failed.
        """
        self._flush_pending()
        target = self._n.queued
        while self._n.delivered < target:
            if self._failure is not None:
                raise self._stopped_error()
            if self._finished:
                raise StoppedError("the event recorder stopped before delivering every event")
            await self._progress.wait()
        if self._failure is not None:
            raise self._stopped_error()

    async def wait_persisted(self) -> None:
        """Wait until every event recorded so far is persisted (delivered or not)."""
        self._flush_pending()
        target = self._n.queued
        while self._n.persisted < target:
            if self._failure is not None:
                raise self._stopped_error()
            if self._finished:
                raise StoppedError("the event recorder stopped before persisting every event")
            await self._progress.wait()
        if self._failure is not None:
            raise self._stopped_error()

    def discard_undelivered(self) -> None:
        """Stop delivering: drop what waits for the consumer (it stays in the journal).

        When the consumer has gone (a closing session's: the events that close it are still
        persisted), or there is none (``Session.stop_delivery``: it reads the journal).
        """
        self._discard_undelivered = True
        while self._to_deliver:
            _, size = self._to_deliver.popleft()
            self._release(size)
            self._n.delivered += 1
        self._progress.notify()

    def close(self) -> None:
        """Accept nothing more; :meth:`run` returns once everything accepted is persisted."""
        self._flush_pending()
        self._closing = True
        self._writer_wake.notify()
        self._progress.notify()
