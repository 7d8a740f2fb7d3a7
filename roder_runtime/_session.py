"""Sessions: a thread's turns driven by submitted ops, every event persisted before delivery.

A :class:`Session` takes ops synchronously (:meth:`Session.submit`) into a bounded queue,
runs one turn at a time in the background, and records every event through an
:class:`~roder_runtime._recorder.EventRecorder`, which persists it to the thread's journal
before :meth:`Session.next_event` hands it out.

Its background tasks live in a task group opened by ``Runtime.start_session`` and closed by
:meth:`Session.aclose`; as with any anyio task group, open and close it in the same task
(``async with await runtime.start_session(...) as session:`` does).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import anyio.abc

from roder_api.errors import (
    BusyError,
    InputTooLargeError,
    RecorderError,
    StoppedError,
)
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.inference import InferenceEngine
from roder_api.transcript import AssistantMessage, TranscriptItem, UserMessage
from roder_runtime import _compaction
from roder_runtime._recorder import QUEUE_FULL, EventRecorder, event_size
from roder_runtime._turns import new_id, run_turn

if TYPE_CHECKING:
    from roder_runtime._runtime import Runtime


@dataclass(frozen=True, slots=True)
class UserInput:
    """An op: start a turn with ``text`` as the user's message (queued behind running turns)."""

    text: str


@dataclass(frozen=True, slots=True)
class Interrupt:
    """An op: stop turn ``turn_id`` now, keeping the text already delivered."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class Steer:
    """An op: new user input for the running turn; it preempts a running compaction.

    The running turn finishes its current model call, then adds ``text`` as a user message
    of the same turn and calls the model again. With no turn running it starts a turn, like
    :class:`UserInput`.
    """

    text: str


Op: TypeAlias = UserInput | Interrupt | Steer
"""What :meth:`Session.submit` takes."""

_PAGE = 256


@dataclass(slots=True)
class _Queued:
    turn_id: str
    text: str
    interrupted: bool = False


@dataclass(slots=True)
class _RunningTurn:
    turn_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    abort_reason: str | None = None
    steering: list[str] = field(default_factory=list)
    step_text: list[str] = field(default_factory=list)
    started: bool = False
    input_recorded: bool = False
    finished: bool = False


class SessionStart(Awaitable["Session"]):
    """What ``Runtime.start_session`` returns: await it, or use it as ``async with``.

    ``session = await runtime.start_session(...)`` starts the session (close it with
    ``aclose()``); ``async with runtime.start_session(...) as session:`` also closes it.
    """

    def __init__(self, starting: Coroutine[Any, Any, Session]) -> None:
        self._starting = starting
        self._session: Session | None = None

    def __await__(self) -> Generator[Any, None, Session]:
        return self._starting.__await__()

    async def __aenter__(self) -> Session:
        self._session = await self._starting
        return self._session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.aclose()


class Session:
    """A live conversation on one thread: submit ops, read persisted events in order.

    Made by ``Runtime.start_session``. ``submit`` is synchronous and bounded; events come
    from ``await next_event()`` already persisted (an event returned is visible through
    ``Runtime.event_page``); ``await flush()`` waits until everything recorded so far is
    persisted and delivered. Close with ``aclose()`` or ``async with``.
    """

    def __init__(
        self,
        runtime: Runtime,
        thread_id: str,
        engine: InferenceEngine,
        model: str,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.thread_id = thread_id
        self.engine = engine
        self.model = model
        config = runtime.config
        self._max_input_bytes = config.max_input_bytes
        self._capacity = config.submission_queue_capacity
        self._queue: deque[_Queued] = deque()
        self._queue_signal = anyio.Event()
        self._turn: _RunningTurn | None = None
        self._preempt: anyio.Event | None = None
        self._closing = False
        self._closed = False
        self._error: BaseException | None = None
        self._worker_started = False
        self._worker_done = anyio.Event()
        self._recorder_done = anyio.Event()

        async def append(events: Sequence[Event]) -> list[JournalEvent]:
            return await runtime.append_events(thread_id, events)

        self.recorder = EventRecorder(
            append,
            event_capacity=config.recorder_event_capacity,
            byte_budget=config.recorder_byte_budget,
        )
        self._task_group: anyio.abc.TaskGroup | None = None
        self._on_close = on_close

    # --- lifecycle -------------------------------------------------------------------------

    async def _start(self) -> None:
        """Start the background tasks and close a turn a dead process left running."""
        open_turn = await self._find_open_turn()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._run_recorder)
        try:
            if open_turn is not None:
                self.recorder.record(TurnAborted(open_turn, "process_exited"))
                await self.recorder.wait_persisted()
        except BaseException:
            await self._shutdown()
            raise
        self._worker_started = True
        task_group.start_soon(self._run_worker)

    async def _find_open_turn(self) -> str | None:
        """Return the id of the journal's last turn when it never ended, else None."""
        before: int | None = None
        while True:
            page = await self.runtime.event_page(self.thread_id, before=before, limit=_PAGE)
            for entry in reversed(page.events):
                event = entry.event
                if isinstance(event, (TurnComplete, TurnAborted)):
                    return None
                if isinstance(event, TurnStarted):
                    return event.turn_id
            if page.next_before is None:
                return None
            before = page.next_before

    async def _run_recorder(self) -> None:
        try:
            await self.recorder.run()
        finally:
            self._recorder_done.set()
            turn = self._turn
            if self.recorder.failure is not None and turn is not None:
                # Nothing more can be journaled: stop the turn and close its stream now.
                turn.abort_reason = turn.abort_reason or "failed"
                turn.scope.cancel()

    async def aclose(self) -> None:
        """Close the session: abort a running turn (``closed``) and persist what is left.

        Inputs still queued are journaled as turns aborted with reason ``closed``, so nothing
        accepted is lost. Events not yet delivered stay in the journal.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._shutdown()
        finally:
            if self._on_close is not None:
                self._on_close()

    async def _shutdown(self) -> None:
        # Wait for the tasks under a shield, then leave the task group outside it (scopes
        # must unwind in the order they were entered).
        with anyio.CancelScope(shield=True):
            await self._stop_tasks()
        task_group, self._task_group = self._task_group, None
        if task_group is not None:
            await task_group.__aexit__(None, None, None)

    async def _stop_tasks(self) -> None:
        self._closing = True
        turn = self._turn
        if turn is not None and turn.abort_reason is None:
            turn.abort_reason = "closed"
            turn.scope.cancel()
        self._queue_signal.set()
        self.recorder.discard_undelivered()
        if self._task_group is None:
            return
        if self._worker_started:
            await self._worker_done.wait()
        self.recorder.close()
        await self._recorder_done.wait()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- submitting ------------------------------------------------------------------------

    @property
    def running_turn_id(self) -> str | None:
        """Return the id of the turn running now, or None."""
        turn = self._turn
        return turn.turn_id if turn is not None and not turn.finished else None

    def submit(self, op: Op) -> str | None:
        """Submit an op; return the turn id a ``UserInput`` (or turn-starting ``Steer``) gets.

        Raised ``InputTooLargeError`` when the text is over ``max_input_bytes`` and
        ``BusyError`` when the submission queue is full (``submission_queue_capacity``):
        in both cases nothing was queued. ``StoppedError`` once the session is closed or
        stopped. An ``Interrupt`` or ``Steer`` aimed at the running turn acts at once and
        takes no place in the queue; an ``Interrupt`` of a turn that is not running or
        queued does nothing.
        """
        self._check_usable()
        if isinstance(op, Interrupt):
            self._interrupt(op.turn_id)
            return None
        if isinstance(op, (UserInput, Steer)):
            size = len(op.text.encode("utf-8"))
            if size > self._max_input_bytes:
                raise InputTooLargeError(size, self._max_input_bytes)
            if isinstance(op, Steer):
                if self._preempt is not None:
                    self._preempt.set()
                turn = self._turn
                if turn is not None and not turn.finished and turn.abort_reason is None:
                    turn.steering.append(op.text)
                    return turn.turn_id
            return self._enqueue(op.text, new_id("turn"))
        raise TypeError(f"not a session op: {op!r}")

    def _submit_turn(self, text: str, turn_id: str) -> str:
        """Submit ``text`` as a turn with a chosen id (``Runtime.run_turn`` keeps its ids)."""
        self._check_usable()
        size = len(text.encode("utf-8"))
        if size > self._max_input_bytes:
            raise InputTooLargeError(size, self._max_input_bytes)
        return self._enqueue(text, turn_id)

    def _check_usable(self) -> None:
        if self._closing:
            raise StoppedError("the session is closed; start a new one")
        failure = self._error or self.recorder.failure
        if failure is not None:
            error = StoppedError(f"the session stopped: {failure}; start a new one")
            error.__cause__ = failure
            raise error

    def _enqueue(self, text: str, turn_id: str) -> str:
        if len(self._queue) >= self._capacity:
            raise BusyError(
                f"the session's submission queue is full ({self._capacity} waiting); "
                "wait for a turn to finish and submit again"
            )
        self._queue.append(_Queued(turn_id, text))
        self._queue_signal.set()
        return turn_id

    def _interrupt(self, turn_id: str) -> None:
        turn = self._turn
        if turn is not None and turn.turn_id == turn_id and not turn.finished:
            if turn.abort_reason is None:
                turn.abort_reason = "interrupted"
                turn.scope.cancel()
            return
        for queued in self._queue:
            if queued.turn_id == turn_id:
                queued.interrupted = True

    @contextlib.contextmanager
    def compaction_preempt(self) -> Iterator[anyio.Event]:
        """Return an event that a ``Steer`` sets while this block runs.

        Give it to ``Runtime.compact_with_provider(..., preempt=event)`` so that the user
        steering discards the candidate boundary instead of waiting for it.
        """
        event = anyio.Event()
        previous, self._preempt = self._preempt, event
        try:
            yield event
        finally:
            self._preempt = previous

    # --- events ----------------------------------------------------------------------------

    async def next_event(self) -> JournalEvent:
        """Return the next event, already persisted to the thread's journal.

        Raised ``RecorderError`` when persisting failed (nothing more is delivered) and
        ``StoppedError`` when the session is closed.
        """
        return await self.recorder.next_event()

    async def flush(self) -> None:
        """Wait until every event recorded so far is persisted and delivered.

        Raised ``RecorderError`` (with the store's error as ``__cause__``) when persisting
        failed.
        """
        await self.recorder.flush()

    # --- the worker ------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        try:
            await self._work()
        except RecorderError as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - kept and reported by submit and next_event
            self._error = exc
            # Nothing more can happen in this session: let the consumer know.
            self.recorder.fail(exc)
        finally:
            self._worker_done.set()

    async def _work(self) -> None:
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._queue_signal = anyio.Event()
                await self._queue_signal.wait()
            queued = self._queue[0]
            if not self._closing:
                # A turn starts once the consumer has everything before it: the recorder's
                # whole capacity is then the turn's (backpressure at turn boundaries).
                await self.recorder.flush()
            self._queue.popleft()
            if self._closing:
                await self._record_unstarted(queued, "closed")
            elif queued.interrupted:
                await self._record_unstarted(queued, "interrupted")
            else:
                await self._run_turn(queued)

    async def _record_unstarted(self, queued: _Queued, reason: str) -> None:
        await self._record_surely(
            TurnStarted(queued.turn_id),
            ItemCompleted(queued.turn_id, UserMessage(queued.text)),
            TurnAborted(queued.turn_id, reason),
        )

    async def _record_surely(self, *events: Event) -> None:
        """Record events the session must not lose, waiting for room when the queue is full.

        The events are recorded together (one batch, so one atomic append when nothing else
        is queued) once there is room for all of them. Room comes from the consumer (or,
        once closing, from persisting alone).
        """
        size = sum(event_size(event) for event in events)
        while not self.recorder.has_room(len(events), size) and self.recorder.held:
            if self._closing:
                await self.recorder.wait_persisted()
            else:
                await self.recorder.flush()
        for event in events:
            self.recorder.record(event, room_checked=True)

    async def _run_turn(self, queued: _Queued) -> None:
        turn_id = queued.turn_id
        turn = _RunningTurn(turn_id)
        self._turn = turn
        try:
            await self._turn_body(turn, queued)
        finally:
            turn.finished = True
            self._turn = None

    async def _turn_body(self, turn: _RunningTurn, queued: _Queued) -> None:
        turn_id = turn.turn_id
        user_message = UserMessage(queued.text)

        def track(event: Event) -> None:
            if isinstance(event, TurnStarted):
                turn.started = True
            elif isinstance(event, ModelStepStarted):
                turn.step_text.clear()
            elif isinstance(event, AssistantContentDelta):
                if event.phase is ContentPhase.FINAL_ANSWER:
                    turn.step_text.append(event.delta)
            elif isinstance(event, ItemCompleted):
                if isinstance(event.item, AssistantMessage):
                    turn.step_text.clear()
                elif event.item == user_message:
                    turn.input_recorded = True
            elif isinstance(event, (TurnComplete, TurnAborted)):
                turn.finished = True

        async def emit(events: Sequence[Event]) -> None:
            for event in events:
                if turn.abort_reason is not None:
                    return  # aborted: nothing the stream produces afterwards is recorded
                if isinstance(event, AssistantContentDelta):
                    # Streamed text is admitted or refused at once: a full recorder (the
                    # consumer fell behind) stops the turn.
                    self.recorder.record(event)
                else:
                    # Items, usage and turn boundaries are never dropped: wait for room.
                    await self._record_surely(event)
                track(event)

        async def record_persisted(events: Sequence[Event]) -> None:
            # Compaction's events are journaled even while the turn is being aborted: its
            # discarded attempts are billed, and they all precede the turn's TurnAborted.
            await self._record_surely(*events)
            for event in events:
                track(event)
            await self.recorder.wait_persisted()

        def next_input() -> list[str]:
            taken, turn.steering = turn.steering, []
            return taken

        error: ErrorEvent | None = None
        timeout = self.runtime.config.turn_timeout_s
        if timeout is not None:
            turn.scope.deadline = anyio.current_time() + timeout
        with turn.scope:
            try:
                history = await self.runtime.replay_history(self.thread_id)
                transcript = await self._begin_turn(turn, history, user_message, record_persisted)
                if transcript is not None:
                    await run_turn(
                        self.engine,
                        self.runtime.config,
                        thread_id=self.thread_id,
                        turn_id=turn_id,
                        model=self.model,
                        transcript=transcript,
                        emit=emit,
                        next_input=next_input,
                    )
            except RecorderError as exc:
                if str(exc) != QUEUE_FULL:
                    raise
                # The consumer fell behind: the turn stops; it ends once there is room.
                error = ErrorEvent(str(exc), turn_id)
            except Exception as exc:  # noqa: BLE001 - a broken engine or read fails its turn only
                error = ErrorEvent(
                    f"the turn failed (engine {self.engine.id!r}): {type(exc).__name__}: {exc}",
                    turn_id,
                )
        if (
            timeout is not None
            and turn.scope.cancelled_caught
            and turn.abort_reason is None
            and not turn.finished
        ):
            # The deadline passed (an interrupt or a close sets its reason before cancelling).
            turn.abort_reason = "timeout"
            error = ErrorEvent(
                f"the turn did not finish within turn_timeout_s = {timeout:g} s; engine "
                f"{self.engine.id!r} was stopped",
                turn_id,
            )
        if turn.finished:
            return
        if error is not None:
            turn.abort_reason = turn.abort_reason or "failed"
        if turn.abort_reason is None:
            return
        turn.finished = True
        # The input is journaled whatever happened, and the turn closed after it.
        events: list[Event] = []
        if not turn.started:
            events.append(TurnStarted(turn_id))
        if not turn.input_recorded:
            events.append(ItemCompleted(turn_id, user_message))
        text = "".join(turn.step_text)
        if text:
            events.append(ItemCompleted(turn_id, AssistantMessage(text, interrupted=True)))
        if error is not None:
            events.append(error)
        events.append(TurnAborted(turn_id, turn.abort_reason))
        await self._record_surely(*events)

    async def _begin_turn(
        self,
        turn: _RunningTurn,
        history: Sequence[TranscriptItem],
        user_message: UserMessage,
        record: Callable[[Sequence[Event]], Awaitable[None]],
    ) -> list[TranscriptItem] | None:
        """Journal the turn's start and input, compacting first when the history is too big.

        Return the first model call's transcript, or None when the turn already ended here
        (the history does not fit and could not be compacted). A ``Steer`` meanwhile sets
        the compaction's preempt event: the candidate boundary is discarded at once.
        """
        with self.compaction_preempt() as preempt:
            return await _compaction.begin_turn(
                self.runtime,
                self.thread_id,
                turn.turn_id,
                self.engine,
                self.model,
                history,
                user_message,
                record,
                preempt=preempt,
            )
