"""The turn driver: one turn from start to end, and the outcome it reports.

A :class:`TurnDriver` owns everything of one turn — journaling its start and input (its
:class:`SubmittedInput` says how; :func:`turn_end` composes the end), automatic
compaction, the model steps (through the model-call primitive, with retries and visible
``WarningEvent`` s), steering, partial text, the error and the abort — and returns a
:class:`TurnOutcome`. It knows its own state because it emits every event itself; the
session only hands it a :class:`TurnSink` (the recorder), a journal, the model catalog and
an :class:`Inbox` for steering, and may stop it with :meth:`TurnDriver.abort`.

The step loop (:meth:`TurnDriver._steps`) has two seams for later work:

* **tool step** — after a model step that ended with tool calls, the driver hands the calls
  to its ``tool_step`` (a :class:`ToolRunner`) and loops with their results (past
  ``max_tool_steps`` each is refused with a result and the turn fails); calls of client
  tools are not run: the turn ends with them open (``roder_runtime.tools._client_tools``);
* **in-turn native compaction** — a model step collects its items (:class:`StepState.items`) and
  journals them as one batch when the step ends with ``Completed``; on an engine with
  native compaction a ``ProviderMetadata`` boundary yielded by ``stream_turn`` is staged by
  ``roder_runtime.turn._inturn`` and commits (or is discarded) with that batch, in
  :meth:`TurnDriver._finish_step`; on any other engine the steps are plain until one
  streams a boundary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio

from roder_api.errors import CompactionError, RecorderError, RecorderFullError, StoreError
from roder_api.events import (
    AbortReason,
    AssistantContentDelta,
    ContentPhase,
    Event,
    ItemCompleted,
    ModelStepStarted,
    TurnStarted,
    UsagePurpose,
    WarningEvent,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ReasoningDelta,
    ToolCallCompleted,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    TranscriptItem,
    UserMessage,
)
from roder_runtime.compaction._auto import auto_compaction_due, maybe_auto_compact
from roder_runtime.model._call import Attempt, RetryNotice, call_model
from roder_runtime.model._catalog import ModelCatalog
from roder_runtime.model._ids import new_id
from roder_runtime.store._journal import ReplayHistory
from roder_runtime.tools._client_tools import TurnOptions, input_items
from roder_runtime.tools._tool_step import PendingToolStep, ToolStepLimitError
from roder_runtime.turn._budget import BudgetExceeded, BudgetGuard
from roder_runtime.turn._edges import SubmittedInput, turn_end
from roder_runtime.turn._inturn import InTurnCompaction, is_boundary
from roder_runtime.turn._seams import HeldUsage, Inbox, StepState, ToolRunner, TurnOutcome, TurnSink


class _TurnFailed(Exception):
    """Raised inside the driver to end the turn with an ``ErrorEvent`` (its message)."""


class TurnDriver:
    """Runs one turn (see the module docstring); :meth:`run` returns its outcome."""

    def __init__(
        self,
        *,
        submitted: SubmittedInput,
        engine: InferenceEngine,
        model: str,
        catalog: ModelCatalog,
        sink: TurnSink,
        inbox: Inbox,
        options: TurnOptions | None = None,
    ) -> None:
        self.turn_id = turn_id = submitted.turn_id
        self.input = submitted
        options = options or TurnOptions()
        self.inputs = input_items(submitted.text, options.tool_results)  # results, then text
        self.engine = engine
        self.model = model
        self.catalog = catalog
        self.config = catalog.config
        instructions = options.instructions
        self.instructions = instructions if instructions is not None else self.config.instructions
        self.sink = sink
        self.journal = sink.journal
        self.inbox = inbox
        self.tool_step, self.resume = options.tool_step, options.resume
        step_specs = options.tool_step.specs if options.tool_step is not None else ()
        self.tools = (*step_specs, *options.client_tools)
        self.client = frozenset(spec.name for spec in options.client_tools)
        self.scope = anyio.CancelScope()
        self.abort_reason: AbortReason | None = None
        self.finished = False
        self._started = False
        self._partial = ""
        self._waiting_for = f"engine {engine.id!r}"
        self._inturn: InTurnCompaction | None = None  # only with native compaction
        self._mark = 0  # the sequence the history was read at
        self._budget = BudgetGuard(self.config.budget, self.journal, turn_id)
        self._usage = HeldUsage(sink, turn_id, model, engine.id)  # billed with its response
        self._first: list[str] = []  # the first step's id: its start is in the turn's append

    def abort(self, reason: AbortReason) -> None:
        """Stop the turn now (``interrupted``, ``closed``, ...), keeping the text delivered."""
        if not self.finished and self.abort_reason is None:
            self.abort_reason = reason
            self.scope.cancel()

    # --- the whole turn ------------------------------------------------------------------------

    async def run(self) -> TurnOutcome:
        """Run the turn to its end; return how it ended (its events are all recorded)."""
        error: str | None = None
        last_text: str | None = None
        timeout = self.config.turn_timeout_s
        if timeout is not None:
            self.scope.deadline = anyio.current_time() + timeout
        with self.scope:
            try:
                step, pending = self.tool_step, self.resume
                transcript = await (
                    self._resume(step, pending) if step and pending else self._begin()
                )
                last_text = await self._steps(transcript)
            except (_TurnFailed, ToolStepLimitError, BudgetExceeded) as exc:
                error = str(exc)
            except RecorderFullError as exc:
                # The consumer fell behind: the turn stops; it ends once there is room.
                error = str(exc)
            except RecorderError:
                raise  # nothing more can be journaled: the session stops
            except StoreError as exc:
                error = f"the turn failed ({self.journal.store_name}): {exc}"
            except Exception as exc:  # noqa: BLE001 - a broken engine fails its turn only
                error = f"the turn failed (engine {self.engine.id!r}): {type(exc).__name__}: {exc}"
        if self.finished:
            return TurnOutcome(self.turn_id, None, last_text)
        if self.scope.cancelled_caught and self.abort_reason is None and timeout is not None:
            # The deadline passed (an interrupt or a close sets its reason before cancelling).
            self.abort_reason = AbortReason.TIMEOUT
            error = (
                f"the turn did not finish within turn_timeout_s = {timeout:g} s; "
                f"{self._waiting_for} was stopped"
            )
        reason = self.abort_reason or AbortReason.FAILED
        self.finished = True
        if self.tool_step is None or not self.tool_step.left_pending:  # else left open
            await self._end_aborted(reason, error)
        return TurnOutcome(self.turn_id, reason)

    async def _end_aborted(self, reason: AbortReason, error: str | None) -> None:
        """Journal the end of an aborted turn: its input whatever happened, the partial
        text, steering that came too late for a model call, the error, then the end."""
        end = turn_end(
            self.turn_id,
            reason,
            unstarted=not self._started,
            inputs=self.input.journal(self.inputs),
            discarded=self._inturn.discard_staged() if self._inturn else (),  # staged last
            partial=self._partial,
            steering=self.inbox.close(),
            error=error,
        )
        await self.sink.record(*end)

    # --- start and input -----------------------------------------------------------------------

    async def _begin(self) -> list[TranscriptItem]:
        """Journal the turn's start and input, compacting in between when due; return the
        first model call's transcript. The input is journaled (its items, or its acceptance
        when a compaction comes first) with the start, before any model call (and, when
        nothing can come between them, with the first step's start: one append)."""
        self._waiting_for = self.journal.store_name
        history = await self._read_history()
        due = await auto_compaction_due(self.catalog, self.engine, self.model, history, self.inputs)
        first = self._first = [] if due or self._budget.budget.enabled else [new_id("step")]
        await self.sink.record(
            TurnStarted(self.turn_id, self.input.take_metadata()),
            *self.input.journal(None if due else self.inputs),
            *(ModelStepStarted(self.turn_id, s, self.model, self.engine.id) for s in first),
        )
        self._started = True
        self.input.journaled.set()
        if not due:
            return [*history, *self.inputs]
        try:
            with self.inbox.preempt() as preempt:
                compacted = await maybe_auto_compact(
                    self.journal,
                    self.catalog,
                    self.turn_id,
                    self.engine,
                    self.model,
                    history,
                    pending=self.inputs,
                    preempt=preempt,
                )
        except CompactionError as exc:
            raise _TurnFailed(str(exc)) from exc
        await self.sink.record(*self.input.journal(self.inputs))
        return [*compacted, *self.inputs]

    async def _resume(self, step: ToolRunner, pending: PendingToolStep) -> list[TranscriptItem]:
        """Finish the calls a dead process left without results; return the transcript."""
        self._started = True
        history = await self._read_history()
        return [*history, *await step.run(pending.calls, pending.states)]

    async def _read_history(self) -> ReplayHistory:
        """Read the replay history; in-turn commits check for others' items from its end."""
        history = await self.journal.replay_history()
        self._mark = history.sequence
        if self.engine.supports_native_compaction:  # else no in-turn compaction work at all
            self._inturn = InTurnCompaction(self.turn_id, self.sink, self.journal, self._mark)
        return history

    # --- the steps -----------------------------------------------------------------------------

    async def _steps(self, transcript: Sequence[TranscriptItem]) -> str | None:
        """Run model steps until the model answers; return the turn's last assistant text.

        After each model step: if it ended with tool calls, they run (a tool step) and the
        loop goes on with their results; else steering that arrived meanwhile joins the turn;
        else the turn completes — deciding "no more steering" atomically with the inbox, so
        that a ``Steer`` arriving now goes to the next turn instead of being lost."""
        history = list(transcript)
        last_text: str | None = None
        while True:
            step = await self._model_step(history)
            if step.preempted and self._inturn:  # a steer stopped a step holding a boundary
                self._partial = ""
                history += await self._inturn.preempted(step.text, self.inbox.take())
                continue
            items = self._step_items(step)
            if step.text:
                last_text = step.text
            calls = [i for i in items if isinstance(i, ToolCallRecord)]
            runs = [c for c in calls if c.name not in self.client]  # the rest: the client's
            if runs and self.tool_step is not None:
                # The tool step: the calls are journaled before they run; then their results.
                await self._finish_step(items, [])
                history += [*items, *await self.tool_step.run(runs)]
                if len(runs) == len(calls):
                    continue
                items = []  # journaled; the client's calls stay open: the turn ends
            steering = self.inbox.take_or_close()
            if steering and len(runs) == len(calls):
                messages = [UserMessage(text) for text in steering]
                await self._finish_step(items, [ItemCompleted(self.turn_id, m) for m in messages])
                history += [*items, *messages]
                continue
            self.finished = True
            end = turn_end(self.turn_id, None, steering=steering, last_text=last_text)  # kept
            with anyio.CancelScope(shield=True):  # decided: the turn completes, whatever comes
                await self._finish_step(items, end)
            return last_text if last_text is not None else ""

    def _step_items(self, step: StepState) -> list[TranscriptItem]:
        items = list(step.items)
        if step.reasoning:
            items.append(Reasoning(step.reasoning))
        if step.text:
            items.append(AssistantMessage(step.text))
        return items

    async def _finish_step(self, items: Sequence[TranscriptItem], then: Sequence[Event]) -> None:
        """Journal a completed step's items as one batch, followed by ``then`` (a staged
        in-turn boundary commits first in the same conditional append)."""
        self._partial = ""
        events = [*(ItemCompleted(self.turn_id, i) for i in items), *then]
        await (self._inturn.finish(events) if self._inturn else self.sink.record(*events))

    async def _model_step(self, history: Sequence[TranscriptItem]) -> StepState:
        """Call the model once (with retries); return the completed step or end the turn.

        A retryable failure before any output retries the step (a ``WarningEvent`` says so);
        afterwards, or when not retryable, ``_TurnFailed`` ends the turn, keeping its text."""
        request = AgentInferenceRequest(self.model, self.instructions, (*history,), self.tools)
        await self._budget.check(self, history)  # BudgetExceeded ends the turn before the call
        step = StepState()

        async def start(number: int) -> AsyncIterator[InferenceEvent]:
            nonlocal step
            announced = self._first.pop() if self._first else None  # one append, not two
            step = StepState(announced or new_id("step"))
            started = ModelStepStarted(self.turn_id, step.step_id, self.model, self.engine.id)
            await self.sink.record(*[] if announced else [started])
            self._waiting_for = f"engine {self.engine.id!r}"
            ctx = InferenceTurnContext(
                self.journal.thread_id, self.turn_id, step.step_id, UsagePurpose.TURN, number
            )
            return self.engine.stream_turn(ctx, request)

        async def consume(attempt: Attempt, event: InferenceEvent) -> bool:
            return await self._consume(step, event)

        async def before_retry(attempt: Attempt, notice: RetryNotice) -> None:
            await self._usage.settle()  # the failed attempt's usage, then the warning
            await self.sink.record(WarningEvent(notice.message("model call"), self.turn_id))

        try:
            with self.inbox.preempt() as steer:  # a steer waits, unless a boundary is staged
                attempts = await call_model(
                    start,
                    consume,
                    reliability=self.config.reliability,
                    retryable=lambda attempt: not attempt.produced,
                    before_retry=before_retry,
                    preempt=self._inturn.call(steer) if self._inturn else None,
                )
        finally:
            await self._usage.settle()
        last = attempts[-1]
        if self._inturn and self._inturn.ended(last, step.failure is not None, step.completed):
            step.preempted = True  # the boundary is discarded, the turn goes on
            return step
        if last.error is not None:
            error = last.error
            raise _TurnFailed(
                f"the turn failed (engine {self.engine.id!r}): {type(error).__name__}: {error}"
            )
        if last.failure is not None:
            raise _TurnFailed(f"model call failed: {last.failure}")
        if step.failure is not None:
            raise _TurnFailed(f"model call failed: {step.failure}")
        if not step.completed:
            raise _TurnFailed("the model stream ended without completing")
        return step

    async def _consume(self, step: StepState, event: InferenceEvent) -> bool:
        """Emit (deltas, usage) or stage (items) one engine event; False when it ended."""
        if self._usage.held is not None:  # the usage before it, with Completed's response id
            await self._usage.release(event)
        if isinstance(event, MessageDelta):
            if event.text:
                first = not step.text
                self.sink.stream(
                    AssistantContentDelta(
                        self.turn_id, step.step_id, ContentPhase.FINAL_ANSWER, event.text
                    )
                )
                step.text += event.text
                self._partial = step.text
                if first:
                    # The answer's first text is persisted (and so delivered) before the
                    # stream is read on: an engine that sent much at once would otherwise
                    # keep the event loop, and the GIL, from the thread that syncs it.
                    await self.sink.persisted()
        elif isinstance(event, ReasoningDelta):
            if event.text:
                self.sink.stream(
                    AssistantContentDelta(
                        self.turn_id, step.step_id, ContentPhase.REASONING, event.text
                    )
                )
                step.reasoning += event.text
        elif isinstance(event, ToolCallCompleted):
            step.items.append(ToolCallRecord(event.id, event.name, event.arguments))
        elif isinstance(event, Usage):
            await self._usage.hold(event.usage)  # billed with the next event, or at the end
        elif is_boundary(event):  # in-turn compaction: committed with the step
            if self._inturn is None:  # an engine without compact_turn may compact in turn too
                self._inturn = InTurnCompaction(self.turn_id, self.sink, self.journal, self._mark)
            await self._inturn.stage(event)
        elif isinstance(event, ProviderMetadata):
            step.items.append(event)
        elif isinstance(event, Completed):
            step.completed = True
            return False
        elif isinstance(event, Failed):
            step.failure = event.message
            return False
        else:
            raise TypeError(
                f"engine {self.engine.id!r} yielded {type(event).__name__}, not an inference event"
            )
        return True
