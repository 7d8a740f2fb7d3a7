"""Transactional compaction: stage a candidate boundary, then commit it atomically or discard it.

The promise: the replayable history is only trimmed after a clean compaction boundary is
durably committed, and every token observed is billed.

* :func:`compact` asks the engine for a boundary — natively through ``compact_turn``, or by
  summarising through ``stream_turn`` when the engine has no native compaction — through the
  model-call primitive (:mod:`roder_runtime.model._call`), and stages what the stream
  yields. The commit is one conditional append of the boundary item, its usage and
  ``CompactionCommitted`` on the sequence the compaction last saw: when anyone added items
  meanwhile the candidate is discarded (``conflict``). Anything else journals the usage
  observed (purpose ``discarded_compaction``) and ``CompactionDiscarded`` and raises.

Automatic compaction before a turn's model call: :mod:`roder_runtime.compaction._auto`.
Both take a :class:`~roder_runtime.store._journal.Journal` and a
:class:`~roder_runtime.model._catalog.ModelCatalog`, never the runtime.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import anyio
import orjson

from roder_api.errors import (
    CompactionFailed,
    CompactionPreempted,
    SequenceConflictError,
)
from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionMode,
    CompactionStarted,
    DiscardReason,
    Event,
    ItemCompleted,
    UsagePurpose,
    UsageUpdated,
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
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.transcript import (
    ContextCompaction,
    ProviderMetadata,
    TranscriptItem,
    is_compaction_boundary,
    native_compaction_items,
)
from roder_runtime.compaction._estimates import estimate_transcript_tokens
from roder_runtime.compaction._estimates import usage_report as usage_report  # for `roder compact`
from roder_runtime.compaction._summary import (
    SUMMARY_INSTRUCTIONS,
    summary_boundary,
    summary_budget,
    summary_prompt,
    summary_reserve,
)
from roder_runtime.model._call import (
    Attempt,
    PreemptSignal,
    RetryNotice,
    call_model,
)
from roder_runtime.model._catalog import ModelCatalog
from roder_runtime.model._ids import new_id
from roder_runtime.store._journal import Journal, ReplayHistory

DISCARD_REASONS = tuple(DiscardReason)
"""Every ``CompactionDiscarded.reason`` (the values of :class:`DiscardReason`)."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """A committed compaction.

    ``boundary`` is the item now journaled (a native ``ProviderMetadata`` boundary or a
    ``ContextCompaction`` summary); ``usage`` is what the whole compaction cost, every
    attempt included (all of it billed); ``attempts`` counts the provider calls made;
    ``mode`` is ``native`` or ``summary`` (a :class:`~roder_api.events.CompactionMode`).
    """

    boundary: ProviderMetadata | ContextCompaction
    usage: TokenUsage
    attempts: int
    mode: str = CompactionMode.NATIVE


# --- staging ----------------------------------------------------------------------------------


def _boundary_key(item: ProviderMetadata) -> object:
    """Return what identifies a native boundary: the ids of its compaction items, or its JSON."""
    ids = tuple(entry.get("id") for entry in native_compaction_items(item))
    if ids and all(isinstance(i, str) and i for i in ids):
        return ids
    return orjson.dumps(item.data, option=orjson.OPT_SORT_KEYS, default=str)


@dataclass
class _Candidate:
    """What one compaction attempt's stream produced (staged, not journaled)."""

    mode: CompactionMode
    boundary: ProviderMetadata | None = None
    text: str = ""
    cap: int | None = None  # summary mode: the most output tokens asked for
    reason: DiscardReason | None = None
    detail: str = ""

    def flag(self, reason: DiscardReason, detail: str) -> None:
        # The first problem decides: later ones are consequences of it.
        if self.reason is None:
            self.reason, self.detail = reason, detail

    def offer(self, event: InferenceEvent) -> bool:
        """Stage one event; return False when the stream has ended."""
        if isinstance(event, ProviderMetadata):
            if self.mode is CompactionMode.NATIVE and is_compaction_boundary(event):
                if self.boundary is None:
                    self.boundary = event
                elif _boundary_key(event) != _boundary_key(self.boundary):
                    self.flag(
                        DiscardReason.CONFLICTING_BOUNDARY,
                        "the stream yielded two different boundaries",
                    )
        elif isinstance(event, ToolCallCompleted):
            self.flag(DiscardReason.TOOL_CALL, f"the stream yielded a tool call ({event.name})")
        elif isinstance(event, MessageDelta):
            if self.mode is CompactionMode.SUMMARY:
                self.text += event.text
        elif isinstance(event, (ReasoningDelta, Usage)):
            pass
        elif isinstance(event, Completed):
            return False
        elif isinstance(event, Failed):
            self.flag(DiscardReason.FAILED, f"the provider reported a failure: {event.message}")
            return False
        else:
            what = type(event).__name__
            self.flag(DiscardReason.FAILED, f"the engine yielded {what}, not an event")
            return False
        return True

    def verdict(self, attempt: Attempt) -> DiscardReason | None:
        """Return the discard reason, or None when the candidate may be committed."""
        if attempt.preempted:
            return DiscardReason.PREEMPTED
        if attempt.error is not None:
            self.flag(
                DiscardReason.FAILED,
                f"the engine raised {type(attempt.error).__name__}: {attempt.error}",
            )
        if attempt.timed_out:
            self.flag(DiscardReason.FAILED, "the compaction did not finish within turn_timeout_s")
        if self.reason is not None:
            return self.reason
        if attempt.failure is not None:
            self.detail = self.detail or f"the stream raised {attempt.failure}"
            return DiscardReason.DISCONNECTED
        if not attempt.ended:
            self.detail = "the stream ended without Completed"
            return DiscardReason.NOT_COMPLETED
        if self.mode is CompactionMode.NATIVE and self.boundary is None:
            self.detail = "the stream completed without a compaction boundary"
            return DiscardReason.NO_BOUNDARY
        if self.mode is CompactionMode.SUMMARY and not self.text.strip():
            self.detail = "the summary stream completed without text"
            return DiscardReason.NO_BOUNDARY
        if self.mode is CompactionMode.SUMMARY and self.cap is not None:
            # A server may ignore the cap it was sent; a summary over it would not fit.
            size = attempt.usage.completion_tokens or estimate_transcript_tokens(
                [ContextCompaction(self.text)]
            )
            if size > self.cap:
                self.detail = (
                    f"the summary is {size} tokens; the call asked for at most {self.cap} "
                    "tokens (summary_max_tokens, at most a quarter of the window)"
                )
                return DiscardReason.TOO_LARGE
        return None


# --- the transaction --------------------------------------------------------------------------


def compaction_mode(engine: InferenceEngine, thread_id: str) -> CompactionMode:
    """Return how ``engine`` compacts; raise ``CompactionFailed`` when it cannot at all."""
    if engine.supports_native_compaction:
        return CompactionMode.NATIVE
    if engine.requires_native_compaction:
        raise CompactionFailed(
            f"engine {engine.id!r} requires native compaction but does not implement "
            "compact_turn; nothing was changed",
            thread_id=thread_id,
            reason=DiscardReason.FAILED,
        )
    return CompactionMode.SUMMARY


async def compact(
    journal: Journal,
    catalog: ModelCatalog,
    *,
    turn_id: str,
    engine: InferenceEngine,
    model: str,
    history: Sequence[TranscriptItem],
    preempt: PreemptSignal | None = None,
) -> CompactionResult:
    """Compact ``history`` (the thread's replay history) and commit the boundary.

    The boundary is committed — one conditional append of ``ItemCompleted(boundary)``, its
    ``UsageUpdated(purpose="compaction")`` and ``CompactionCommitted`` — only when the stream
    ended with ``Completed``, yielded exactly one boundary, no tool call and no ``Failed``,
    raised nothing, ``preempt`` was not set, and no item was added to the thread since the
    compaction started. Retryable ``ProviderFailure`` s are retried (``config.reliability``),
    each retry journaled as a ``WarningEvent`` with the failed attempt's usage.

    Raise ``CompactionFailed`` (``.reason``) or ``CompactionPreempted`` (``preempted`` or
    ``conflict``) after journaling the usage observed (purpose ``discarded_compaction``)
    and ``CompactionDiscarded(reason)``; the thread's transcript items are then exactly
    what they were.
    """
    thread_id = journal.thread_id
    read_at = history.sequence if isinstance(history, ReplayHistory) else None
    history = list(history)
    config = catalog.config
    mode = compaction_mode(engine, thread_id)
    if read_at is None:
        # A history without its read sequence: it stands for the thread only if it is the
        # replay history now (else it misses items, and a boundary would hide them).
        current = await journal.replay_history()
        read_at = current.sequence
        if list(current) != history:
            await journal.append(
                [
                    CompactionStarted(turn_id, mode),
                    CompactionDiscarded(DiscardReason.CONFLICT, turn_id),
                ]
            )
            raise CompactionPreempted(
                f"compaction of thread {thread_id} discarded (conflict): the history given is "
                "not the thread's replay history (items were added since it was read); the "
                "history is unchanged and no model was called",
                thread_id=thread_id,
                reason=DiscardReason.CONFLICT,
                attempts=0,
                usage=TokenUsage(),
            )
    cap: int | None = None
    window: int | None = None
    if mode is CompactionMode.NATIVE:
        request = AgentInferenceRequest(model, config.instructions, tuple(history))
    else:
        window = await catalog.context_window(engine, model)
        budget = None
        if window:
            budget = summary_budget(
                window,
                config.compaction.summary_max_tokens,
                estimate_transcript_tokens((), SUMMARY_INSTRUCTIONS),
            )
        cap = summary_reserve(window, config.compaction.summary_max_tokens)
        prompt = summary_prompt(history, budget_tokens=budget)
        request = AgentInferenceRequest(
            model, SUMMARY_INSTRUCTIONS, tuple(prompt), max_output_tokens=cap
        )
    mark = (await journal.append([CompactionStarted(turn_id, mode)]))[-1].sequence
    candidate = _Candidate(mode, cap=cap)

    async def start(number: int) -> AsyncIterator[InferenceEvent]:
        nonlocal candidate
        candidate = _Candidate(mode, cap=cap)
        ctx = InferenceTurnContext(
            thread_id, turn_id, new_id("compaction"), UsagePurpose.COMPACTION, number
        )
        if mode is CompactionMode.NATIVE:
            return engine.compact_turn(ctx, request)
        return engine.stream_turn(ctx, request)

    async def consume(attempt: Attempt, event: InferenceEvent) -> bool:
        # Keep reading after a conflict or a tool call: the usage that follows is billed.
        return candidate.offer(event)

    async def before_retry(attempt: Attempt, notice: RetryNotice) -> None:
        nonlocal mark
        events: list[Event] = []
        if not attempt.usage.is_zero():
            discarded = UsagePurpose.DISCARDED_COMPACTION
            events.append(UsageUpdated(turn_id, attempt.usage, discarded, model, engine.id))
        events.append(WarningEvent(notice.message("compaction"), turn_id))
        mark = (await journal.append(events))[-1].sequence

    attempts: list[Attempt] = []
    try:
        await call_model(
            start,
            consume,
            reliability=config.reliability,
            retryable=lambda attempt: candidate.verdict(attempt) is DiscardReason.DISCONNECTED,
            before_retry=before_retry,
            preempt=preempt,
            attempts=attempts,
        )
        last = attempts[-1]
        total = sum((a.usage for a in attempts), TokenUsage())
        made = _calls(attempts)
        reason = candidate.verdict(last)
        if reason is None and preempt is not None and preempt.is_set():
            reason = DiscardReason.PREEMPTED
        if reason is None:
            boundary: ProviderMetadata | ContextCompaction
            if candidate.boundary is not None:
                boundary = candidate.boundary
            else:
                boundary = summary_boundary(candidate.text, history)
            committed: list[Event] = [
                ItemCompleted(turn_id, boundary),
                last.billed(turn_id, UsagePurpose.COMPACTION, model, engine.id),
                CompactionCommitted(turn_id, mode),
            ]
            with anyio.CancelScope(shield=True):
                if await _commit(journal, committed, read_at, mark):
                    return CompactionResult(boundary, total, made, mode)
            reason = DiscardReason.CONFLICT
            candidate.detail = "new items were added to the thread while compacting"
    except anyio.get_cancelled_exc_class():
        # Cancelled from outside (not by ``preempt``): still bill what was observed.
        with anyio.CancelScope(shield=True):
            usage = attempts[-1].usage if attempts else TokenUsage()
            await _discard(journal, turn_id, usage, DiscardReason.PREEMPTED, (model, engine.id))
        raise
    with anyio.CancelScope(shield=True):
        await _discard(journal, turn_id, last.usage, reason, (model, engine.id))
    detail = candidate.detail
    if reason is DiscardReason.PREEMPTED:
        detail = "preempted before the commit"
    message = (
        f"compaction of thread {thread_id} discarded ({reason}): {detail}; the history is "
        f"unchanged and the {total.total_tokens} tokens used by {made} attempt(s) were billed"
    )
    preempted = reason in (DiscardReason.PREEMPTED, DiscardReason.CONFLICT)
    error_class = CompactionPreempted if preempted else CompactionFailed
    raise error_class(
        message, thread_id=thread_id, reason=reason, attempts=made, usage=total
    ) from last.failure


def _calls(attempts: Sequence[Attempt]) -> int:
    """Return how many attempts called the provider (not those preempted before starting)."""
    return sum(1 for a in attempts if a.called)


async def _commit(journal: Journal, events: Sequence[Event], read_at: int, mark: int) -> bool:
    """Append ``events`` if no item was journaled after ``read_at`` (where the history was
    read); return True when committed. ``mark`` is the last sequence this compaction wrote.

    Events that are not items (input accepted meanwhile, warnings, this compaction's own)
    do not change the history: the commit is tried again on the new last sequence.
    """
    if read_at < mark:
        since = await journal.read_events(after=read_at)
        if any(isinstance(e.event, ItemCompleted) for e in since):
            return False
        mark = max(mark, since[-1].sequence if since else read_at)
    while True:
        try:
            await journal.append(events, expected_last_sequence=mark)
        except SequenceConflictError as conflict:
            later = await journal.read_events(after=mark)
            if any(isinstance(e.event, ItemCompleted) for e in later):
                return False
            mark = later[-1].sequence if later else conflict.actual
            continue
        return True


async def _discard(
    journal: Journal, turn_id: str, usage: TokenUsage, reason: str, billed_by: tuple[str, str]
) -> None:
    events: list[Event] = []
    if not usage.is_zero():
        events.append(UsageUpdated(turn_id, usage, UsagePurpose.DISCARDED_COMPACTION, *billed_by))
    events.append(CompactionDiscarded(reason, turn_id))
    await journal.append(events)
