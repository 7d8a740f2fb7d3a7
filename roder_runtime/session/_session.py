"""Sessions: the submission queue, the recorder and the lifecycle of one thread's turns.

A :class:`Session` holds the thread's lease for its whole life, takes ops through ``await
submit(op)`` into a bounded queue (an accepted input is journaled before ``submit``
returns), hands each turn to a :class:`~roder_runtime.turn._driver.TurnDriver`, and records
every event through an :class:`~roder_runtime.session._recorder.EventRecorder`, which persists it
before :meth:`Session.next_event` hands it out. Its background tasks live in a task group
opened by ``Runtime.start_session`` and closed by :meth:`Session.aclose` in the same task;
they are shielded from that task's cancellation, which closes the session through
``aclose`` instead of tearing a turn apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.abc

from roder_api.errors import BusyError, InputTooLargeError, RecorderError, StoppedError
from roder_api.events import (
    AbortReason,
    Event,
)
from roder_api.inference import InferenceEngine, on_request_sent
from roder_api.threads import ThreadLease
from roder_api.transcript import UserMessage
from roder_runtime.model._catalog import ModelCatalog
from roder_runtime.model._ids import new_id
from roder_runtime.session._follow import JournalFollowing
from roder_runtime.session._io import RecorderSink, TurnInbox
from roder_runtime.session._ops import Interrupt, Op, Steer, UserInput
from roder_runtime.session._recorder import EventRecorder
from roder_runtime.session._resume import CreateThread, LeaseNew, NewThread, find_leftovers
from roder_runtime.session._tools import SessionTools
from roder_runtime.store._journal import ThreadJournal
from roder_runtime.tools._tool_step import ApproveToolCall
from roder_runtime.turn._driver import TurnDriver
from roder_runtime.turn._edges import SubmittedInput, input_bytes, turn_end


class Session(JournalFollowing):
    """A live conversation on one thread: submit ops, read persisted events in order.

    Made by ``Runtime.start_session``, holding the thread's lease until closed. ``await
    submit(op)`` is bounded and returns once the input is journaled; events come from
    ``await next_event()`` already persisted (an event returned is visible through
    ``Runtime.event_page``); ``await flush()`` waits until everything recorded so far is
    persisted and delivered. Close with ``aclose()`` or ``async with``.
    """

    def __init__(
        self,
        *,
        journal: ThreadJournal,
        catalog: ModelCatalog,
        engine: InferenceEngine,
        model: str,
        lease: AbstractAsyncContextManager[ThreadLease],
        on_close: Callable[[Session], None] | None = None,
        tools: SessionTools | None = None,
        follow_journal: bool = False,
    ) -> None:
        self.thread_id = journal.thread_id
        self.journal = journal
        self.catalog = catalog
        self.engine = engine
        self.model = model
        self.lease: ThreadLease | None = None
        self.resumed_turn_id: str | None = None  # a turn left in a tool step: it runs first
        config = catalog.config
        self._max_input_bytes = config.max_input_bytes
        self._capacity = config.submission_queue_capacity
        self._queue: deque[SubmittedInput] = deque()
        self._queue_signal = anyio.Event()
        self._turn: TurnDriver | None = None
        self._inbox: TurnInbox | None = None
        self._preempt: anyio.Event | None = None
        self._closing = False
        self._closed = False
        self._close_reason = AbortReason.CLOSED
        self._error: BaseException | None = None
        self._lease_cm = lease
        self._new: NewThread | None = None
        self._tasks: list[anyio.CancelScope] = []
        self._running: set[anyio.CancelScope] = set()  # the scopes of the tasks not done
        self._worker_done = anyio.Event()
        self._recorder_done = anyio.Event()
        self.recorder = EventRecorder(
            journal.append,
            event_capacity=config.recorder_event_capacity,
            byte_budget=config.recorder_byte_budget,
        )
        self._sink = RecorderSink(journal, self.recorder)
        self._task_group: anyio.abc.TaskGroup | None = None
        self._on_close = on_close
        self.tools = tools or SessionTools({}, config.tools, thread_id=self.thread_id)
        self._init_following(follow_journal)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(
        self, create: CreateThread | None = None, *, lease_new: LeaseNew | None = None
    ) -> None:
        """Take the lease (or raise ``ThreadBusyError``), start the tasks, and close the
        turn a dead session left running; the input it accepted is run as turns. ``create``
        makes the thread, and the lease is taken, while the first turn starts
        (:class:`NewThread`; ``lease_new=`` takes both when it has the first events; its
        error is raised by ``submit``)."""
        if create is None:
            self.lease = await self._lease_cm.__aenter__()
        try:
            task_group = anyio.create_task_group()
            await task_group.__aenter__()
        except BaseException:
            await self._release_lease()
            raise
        self._task_group = task_group
        task_group.start_soon(self._shielded, self._run_recorder)
        try:
            followed, leftovers = 0, []
            if create is not None:  # a new thread: nothing to read back
                self._new = NewThread(
                    self.journal, self.recorder, self._lease_cm, create, lease_new
                )
                task_group.start_soon(self._open_new, self._new)
            else:
                # One read before the leftovers (none missed): where the follower starts,
                # and the open turns the leftovers are looked for from.
                metadata = await self.journal.metadata()
                followed = metadata.last_sequence if self._follow else 0
                leftovers = await find_leftovers(self.journal, self.recorder, metadata)
        except BaseException:
            await self._shutdown()
            raise
        self._queue.extend(
            SubmittedInput(t, text, accepted=True, resume=r, in_turn=r is not None)
            for t, text, r in leftovers
        )
        self.resumed_turn_id = next((t for t, _, r in leftovers if r is not None), None)
        self._own_turns.update(t for t, _, _ in leftovers)
        task_group.start_soon(self._shielded, self._run_worker)
        self._start_following(task_group, followed)

    async def _open_new(self, new: NewThread) -> None:
        self.lease = await new.run()

    async def _release_lease(self) -> None:
        with anyio.CancelScope(shield=True):
            held: AbstractAsyncContextManager[object] | None = self._lease_cm
            if self._new is not None:
                await self._new.done.wait()  # taken or refused: never left half-taken
                held = self._new.held
            if self.lease is not None and held is not None:
                await held.__aexit__(None, None, None)

    async def _shielded(self, run: Callable[[], Awaitable[None]]) -> None:
        # The opener's cancellation must not tear a turn apart: aclose stops the tasks.
        scope = anyio.CancelScope(shield=True)
        self._tasks.append(scope)
        self._running.add(scope)
        try:
            with scope:
                await run()
        finally:
            self._running.discard(scope)  # (a cancel from a task formats its repr: not free)

    async def _run_recorder(self) -> None:
        try:
            await self.recorder.run()
        finally:
            self._recorder_done.set()
            turn = self._turn
            if self.recorder.failure is not None and turn is not None:
                turn.abort(AbortReason.FAILED)  # nothing more can be journaled: stop it now

    async def aclose(self, *, reason: AbortReason = AbortReason.CLOSED) -> None:
        """Close the session: abort a running turn (``reason``) and persist what is left
        (queued inputs become turns aborted with ``reason``); release the lease last."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        try:
            await self._shutdown()
        finally:
            if self._on_close is not None:
                self._on_close(self)

    async def _shutdown(self) -> None:
        # Wait for the tasks under a shield (bounded), then leave the task group outside it
        # (scopes must unwind in the order they were entered).
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(2 * self.journal.timeout_s):
                await self._stop_tasks()
            for scope in self._running:
                scope.cancel()  # only when the deadline passed is anything left to stop
        task_group, self._task_group = self._task_group, None
        try:
            if task_group is not None:
                await task_group.__aexit__(None, None, None)
        finally:
            await self._release_lease()

    async def _stop_tasks(self) -> None:
        self._closing = self._sink.closing = True
        if self._new is not None:
            self._new.go()  # a close does not wait for a model request to make the thread
        self._follow_scope.cancel()
        if self._turn is not None:
            self._turn.abort(self._close_reason)
        self._queue_signal.set()
        self.recorder.discard_undelivered()
        if self._task_group is None:
            return
        if len(self._tasks) > 1:  # the worker started
            await self._worker_done.wait()
        self.recorder.close()
        await self._recorder_done.wait()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- submitting ------------------------------------------------------------------------

    async def submit(self, op: Op, *, turn_id: str | None = None) -> str | None:
        """Submit an op; return the turn id a ``UserInput`` (or a ``Steer``) goes to.

        An input is *accepted* when this returns: it is journaled and will be answered
        (docs/sessions.md). ``turn_id`` names the turn a ``UserInput`` starts. Raised
        ``InputTooLargeError`` over ``max_input_bytes``, ``BusyError`` when the queue is
        full (nothing accepted), ``StoppedError`` once closed. ``Interrupt`` and
        ``ApproveToolCall`` act at once.
        """
        self._check_usable()
        if isinstance(op, Interrupt):
            self.interrupt(op.turn_id)
            return None
        if isinstance(op, ApproveToolCall):
            self.tools.decide_call(op)  # the turn that asked journals the decision
            return None
        if not isinstance(op, (UserInput, Steer)):
            raise TypeError(f"not a session op: {op!r}")
        metadata = op.metadata if isinstance(op, UserInput) else None
        self._check_size(op.text, metadata)
        if isinstance(op, Steer):
            if self._preempt is not None:
                self._preempt.set()
            turn, inbox = self._turn, self._inbox
            if turn is not None and inbox is not None and inbox.open and not turn.abort_reason:
                self._check_room()
                self._record_now(SubmittedInput(turn.turn_id, op.text, steer=True).journal())
                inbox.texts.append(op.text)
                await self._wait_persisted()
                return turn.turn_id
        turn_id = turn_id or new_id("turn")
        async with self.tools.turn_input(turn_id, op, self.journal):  # checked, then kept
            return await self._submit_input(op.text, turn_id, announce=True, metadata=metadata)

    async def submit_turn(self, text: str, turn_id: str) -> str:
        """Queue ``text`` as a turn with a chosen id, journaling it with the turn itself.

        ``Runtime.run_turn`` uses it: its caller waits for the whole turn, so the input is
        journaled as the turn's ``UserMessage`` (after a compaction that comes first)."""
        self._check_usable()
        self._check_size(text)
        return await self._submit_input(text, turn_id, announce=False)

    async def _submit_input(
        self, text: str, turn_id: str, *, announce: bool, metadata: Mapping[str, Any] | None = None
    ) -> str:
        self._check_room()
        await self._take_unread_input()  # accepted elsewhere first: it goes first
        idle = self._turn is None and not self._queue and self.recorder.held == 0
        self._own_turns.add(turn_id)
        # Behind a running turn it is accepted now; else its turn's start journals it at
        # once (after a bounded history read and window lookup), or its end does.
        queued = SubmittedInput(
            turn_id, text, announce=announce or not idle, direct=idle, metadata=metadata
        )
        if not idle:
            self._record_now(queued.journal())
        self._queue.append(queued)
        self._queue_signal.set()
        if idle:
            with anyio.CancelScope(shield=True):
                await queued.journaled.wait()
        await self._wait_persisted()
        return turn_id

    def _record_now(self, events: Sequence[Event]) -> None:
        for event in events:  # never refused: the queue's room was checked
            self.recorder.record(event, room_checked=True)

    async def _wait_persisted(self) -> None:
        # Shielded: a cancelled caller's input is accepted all the same (see ``submit``).
        with anyio.CancelScope(shield=True):
            try:
                await self.recorder.wait_persisted()
            except RecorderError:
                self._check_usable()  # a new thread's own error first (not made, busy)
                raise
        self._check_usable()

    def _check_size(self, text: str, metadata: Mapping[str, Any] | None = None) -> None:
        size = input_bytes(text, metadata)
        if size > self._max_input_bytes:
            raise InputTooLargeError(size, self._max_input_bytes)

    def _check_room(self) -> None:
        steering = len(self._inbox.texts) if self._inbox is not None else 0
        if len(self._queue) + steering >= self._capacity:
            raise BusyError(
                f"the session's submission queue is full ({self._capacity} waiting); "
                "wait for a turn to finish and submit again"
            )

    def _check_usable(self) -> None:
        if self._closing:
            raise StoppedError("the session is closed; start a new one")
        if self._new is not None and self._new.error is not None:
            raise self._new.error  # the thread was not made, or its lease was refused
        failure = self._error or self.recorder.failure
        if failure is not None:
            error = StoppedError(f"the session stopped: {failure}; start a new one")
            error.__cause__ = failure
            raise error

    # --- the worker ------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        try:
            # A new thread is made once the first model request is sent (NewThread.go).
            with on_request_sent(self._new.go if self._new is not None else None):
                await self._work()
        except RecorderError as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - kept and reported by submit and next_event
            self._error = exc
            self.recorder.fail(exc)  # nothing more can happen in this session
        finally:
            for queued in self._queue:
                queued.journaled.set()  # wakes submitters; they see the session stopped
            self._worker_done.set()

    async def _work(self) -> None:
        while True:
            while not self._queue:
                if self._closing:
                    return
                self._queue_signal = anyio.Event()
                await self._queue_signal.wait()
            queued = self._queue[0]
            if not self._closing and not queued.direct:
                # A turn starts once the consumer has everything before it: the recorder's
                # whole capacity is then the turn's (backpressure at turn boundaries).
                await self.recorder.flush()
            self._queue.popleft()
            if self._closing:
                await self._record_unstarted(queued, self._close_reason)
            elif queued.interrupted:
                await self._record_unstarted(queued, AbortReason.INTERRUPTED)
            else:
                await self._drive_turn(queued)

    async def _record_unstarted(self, queued: SubmittedInput, reason: AbortReason) -> None:
        if queued.resume is not None:
            return  # a turn left in a tool step stays open: the next session resumes it
        inputs = queued.journal([UserMessage(queued.text)])
        end = turn_end(
            queued.turn_id, reason, unstarted=True, inputs=inputs, metadata=queued.take_metadata()
        )
        await self._sink.record(*end)
        queued.journaled.set()

    async def _drive_turn(self, queued: SubmittedInput) -> None:
        inbox = TurnInbox(self.compaction_preempt)
        driver = TurnDriver(
            submitted=queued,
            engine=self.engine,
            model=self.model,
            catalog=self.catalog,
            sink=self._sink,
            inbox=inbox,
            options=self.tools.driver_options(queued.turn_id, self._sink, queued.resume),
        )
        self._turn, self._inbox = driver, inbox
        try:
            await driver.run()
        finally:
            self._turn, self._inbox = None, None
            queued.journaled.set()
