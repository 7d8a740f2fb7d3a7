"""Transactional compaction: stage a candidate boundary, then commit it atomically or discard it.

The promise: the replayable history is only trimmed after a clean compaction boundary is
durably committed, and every token observed is billed.

* :func:`compact_with_provider` asks the engine for a boundary — natively through
  ``compact_turn``, or by summarising through ``stream_turn`` when the engine has no native
  compaction — and stages what the stream yields. One atomic append of the boundary item,
  its usage and ``CompactionCommitted`` happens only after a clean stream; anything else
  journals the usage observed (purpose ``discarded_compaction``) and ``CompactionDiscarded``
  and raises. Retryable provider failures are retried with backoff; every attempt is billed.
* :func:`maybe_auto_compact` is the hook a turn calls before a model call: it compacts when
  the estimated replay size passes ``compaction.auto_compact_fraction`` of the model's
  context window, with hysteresis so that it never loops.
* :func:`usage_by_purpose` sums the billed usage of a journal by purpose (turn, compaction,
  discarded compaction) so that a user can see what compaction cost.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import orjson

from roder_api.errors import CompactionError, CompactionFailed, CompactionPreempted
from roder_api.events import (
    CompactionCommitted,
    CompactionDiscarded,
    CompactionStarted,
    ErrorEvent,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnStarted,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
    native_compaction_items,
)
from roder_runtime._retry import retry_delay, should_retry
from roder_runtime._turns import close_stream, new_id

if TYPE_CHECKING:
    from roder_runtime._runtime import Runtime

TURN = "turn"
"""Usage purpose of an ordinary model call of a turn."""
COMPACTION = "compaction"
"""Usage purpose of the attempt whose boundary was committed."""
DISCARDED_COMPACTION = "discarded_compaction"
"""Usage purpose of compaction attempts whose candidate was discarded (retried or failed)."""

NATIVE = "native"
SUMMARY = "summary"

DISCARD_REASONS = (
    "disconnected",
    "failed",
    "conflicting_boundary",
    "tool_call",
    "no_boundary",
    "not_completed",
    "preempted",
)
"""Every ``CompactionDiscarded.reason`` this module journals."""

REARM_FRACTION = 0.1
"""Hysteresis: after a boundary, auto-compaction re-arms once this share of the context
window was added on top of it (or when the history no longer fits at all)."""

SUMMARY_INSTRUCTIONS = (
    "You are compacting a long conversation so that it can continue in a fresh context "
    "window. Write a concise summary of the conversation above that keeps: the user's goal "
    "(their first request), their latest message, the decisions made, the facts and tool "
    "results that still matter, and the work that is still open. Do not call tools. Reply "
    "with the summary only."
)
"""The instructions of a summarising compaction call."""

SUMMARY_REQUEST = "Summarise the conversation so far for its continuation, as instructed."
"""The user message that ends a summarising compaction prompt."""

GOAL_PREFIX = "User's goal: "
LATEST_PREFIX = "Latest user message: "


class PreemptSignal(Protocol):
    """What ``preempt`` must offer: an event such as ``anyio.Event``."""

    def is_set(self) -> bool:
        """Return True once the compaction must stop."""
        ...

    async def wait(self) -> Any:
        """Return once the event is set."""
        ...


Record = Callable[[Sequence[Event]], Awaitable[Any]]
"""Persist (and possibly deliver) a batch of events atomically, in order."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """A committed compaction.

    ``boundary`` is the item now journaled (a native ``ProviderMetadata`` boundary or a
    ``ContextCompaction`` summary); ``usage`` is what the whole compaction cost, every
    attempt included (all of it billed); ``attempts`` counts the provider calls made;
    ``mode`` is ``native`` or ``summary``.
    """

    boundary: ProviderMetadata | ContextCompaction
    usage: TokenUsage
    attempts: int
    mode: str = NATIVE


# --- estimates --------------------------------------------------------------------------------


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def estimate_item_tokens(item: TranscriptItem) -> int:
    """Return a rough token count of one transcript item (four characters a token).

    A native boundary counts the JSON of its ``compacted_input`` (what is replayed), or of
    all its data when it has none.
    """
    if isinstance(item, (UserMessage, AssistantMessage, Reasoning)):
        chars = len(item.text) + len(getattr(item, "encrypted_content", None) or "")
    elif isinstance(item, ToolCallRecord):
        chars = len(item.name) + len(item.arguments)
    elif isinstance(item, ToolResultRecord):
        chars = len(item.name) + len(item.result)
    elif isinstance(item, ContextCompaction):
        chars = len(item.summary)
    elif isinstance(item, ProviderMetadata):
        # What is replayed: the ``compacted_input`` when there is one, else the whole JSON.
        replayed = item.data.get("compacted_input") or item.data
        try:
            chars = len(orjson.dumps(replayed, default=str))
        except TypeError:
            chars = len(str(replayed))
    else:  # an item type from a newer version: count its text form
        chars = len(str(item))
    # A few tokens of per-message framing, as providers count them.
    return _tokens(chars) + 4


def estimate_transcript_tokens(
    items: Iterable[TranscriptItem], instructions: str | None = None
) -> int:
    """Return a rough token count of a model request with ``items`` and ``instructions``."""
    total = _tokens(len(instructions)) if instructions else 0
    return total + sum(estimate_item_tokens(item) for item in items)


# --- usage by purpose -------------------------------------------------------------------------


def sum_usage_by_purpose(entries: Iterable[JournalEvent | Event]) -> dict[str, TokenUsage]:
    """Return the billed usage of journal events summed by purpose, sorted by purpose."""
    totals: dict[str, TokenUsage] = {}
    for entry in entries:
        event = entry.event if isinstance(entry, JournalEvent) else entry
        if isinstance(event, UsageUpdated):
            totals[event.purpose] = totals.get(event.purpose, TokenUsage()) + event.usage
    return dict(sorted(totals.items()))


async def usage_by_purpose(runtime: Runtime, thread_id: str) -> dict[str, TokenUsage]:
    """Return a thread's billed usage by purpose (``turn``, ``compaction``, ...)."""
    entries = await (await runtime.store()).read_events(thread_id)
    return sum_usage_by_purpose(entries)


# --- context windows --------------------------------------------------------------------------

_WINDOWS: weakref.WeakKeyDictionary[Runtime, dict[tuple[str, str], int | None]] = (
    weakref.WeakKeyDictionary()
)


async def model_context_window(runtime: Runtime, engine: InferenceEngine, model: str) -> int | None:
    """Return the context window (tokens) the engine's ``list_models`` gives ``model``.

    A model the engine does not list gets the window all its listed models share, if they
    share one. None when unknown, or when the engine cannot list its models (then it is
    asked again next time). Known answers are cached per runtime.
    """
    cache = _WINDOWS.setdefault(runtime, {})
    key = (engine.id, model)
    if key in cache:
        return cache[key]
    ctx = InferenceProviderContext(settings=dict(runtime.config.engines.get(engine.id, {})))
    try:
        models = await engine.list_models(ctx)
    except Exception:  # a provider that cannot list its models: no auto-compaction this time
        return None
    windows = {m.context_window for m in models}
    window = next((m.context_window for m in models if m.id == model), None)
    if window is None and len(windows) == 1:
        # An unlisted model (e.g. the runtime's derived default) of an engine whose models
        # all share one window: that window is the engine's, whatever the model's name.
        window = next(iter(windows))
    cache[key] = window
    return window


# --- staging one attempt ----------------------------------------------------------------------


def _boundary_key(item: ProviderMetadata) -> object:
    """Return what identifies a native boundary: the ids of its compaction items, or its JSON."""
    ids = tuple(entry.get("id") for entry in native_compaction_items(item))
    if ids and all(isinstance(i, str) and i for i in ids):
        return ids
    return orjson.dumps(item.data, option=orjson.OPT_SORT_KEYS, default=str)


@dataclass
class _Attempt:
    """What one compaction attempt's stream produced (staged, not journaled)."""

    mode: str
    boundary: ProviderMetadata | None = None
    text: str = ""
    usage: TokenUsage = field(default_factory=TokenUsage)
    completed: bool = False
    reason: str | None = None
    detail: str = ""
    failure: ProviderFailure | None = None
    preempted: bool = False

    def flag(self, reason: str, detail: str) -> None:
        # The first problem decides: later ones are consequences of it.
        if self.reason is None:
            self.reason, self.detail = reason, detail

    def offer(self, event: InferenceEvent) -> bool:
        """Stage one event; return False when the stream has ended."""
        if isinstance(event, Usage):
            self.usage = self.usage + event.usage
        elif isinstance(event, ProviderMetadata):
            if self.mode == NATIVE and is_compaction_boundary(event):
                if self.boundary is None:
                    self.boundary = event
                elif _boundary_key(event) != _boundary_key(self.boundary):
                    self.flag("conflicting_boundary", "the stream yielded two different boundaries")
        elif isinstance(event, ToolCallCompleted):
            self.flag("tool_call", f"the stream yielded a tool call ({event.name})")
        elif isinstance(event, MessageDelta):
            if self.mode == SUMMARY:
                self.text += event.text
        elif isinstance(event, ReasoningDelta):
            pass
        elif isinstance(event, Completed):
            self.completed = True
            return False
        elif isinstance(event, Failed):
            self.flag("failed", f"the provider reported a failure: {event.message}")
            return False
        else:
            self.flag("failed", f"the engine yielded {type(event).__name__}, not an event")
            return False
        return True

    def verdict(self) -> str | None:
        """Return the discard reason, or None when the candidate may be committed."""
        if self.preempted:
            return "preempted"
        if self.reason is not None:
            return self.reason
        if self.failure is not None:
            return "disconnected"
        if not self.completed:
            return "not_completed"
        if self.mode == NATIVE and self.boundary is None:
            return "no_boundary"
        if self.mode == SUMMARY and not self.text.strip():
            return "no_boundary"
        return None

    def describe(self) -> str:
        reason = self.verdict()
        if reason == "preempted":
            return "preempted before the commit"
        if self.detail:
            return self.detail
        if reason == "disconnected" and self.failure is not None:
            return f"the stream raised {self.failure}"
        if reason == "not_completed":
            return "the stream ended without Completed"
        if reason == "no_boundary":
            return "the stream completed without a compaction boundary"
        return reason or "committed"


async def _cancel_when_set(preempt: PreemptSignal, scope: anyio.CancelScope) -> None:
    await preempt.wait()
    scope.cancel()


async def _stage(stream: AsyncIterator[InferenceEvent], staged: _Attempt) -> None:
    try:
        async for event in stream:
            # Keep reading after a conflict or a tool call: the usage that follows is billed.
            if not staged.offer(event):
                break
    finally:
        await close_stream(stream)


async def _run_attempt(
    open_stream: Callable[[], AsyncIterator[InferenceEvent]],
    staged: _Attempt,
    preempt: PreemptSignal | None,
) -> None:
    """Stream one attempt into ``staged``; setting ``preempt`` cancels it at once."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            if preempt is not None:
                tg.start_soon(_cancel_when_set, preempt, scope)
            try:
                await _stage(open_stream(), staged)
            except ProviderFailure as failure:
                staged.failure = failure
            except Exception as exc:  # an engine bug must discard the candidate, not commit it
                staged.flag("failed", f"the engine raised {type(exc).__name__}: {exc}")
            finally:
                tg.cancel_scope.cancel()
    if scope.cancelled_caught or (preempt is not None and preempt.is_set()):
        staged.preempted = True


async def _sleep_unless(preempt: PreemptSignal | None, seconds: float) -> bool:
    """Sleep ``seconds``; return True when ``preempt`` was set before or meanwhile."""
    if preempt is None:
        await anyio.sleep(seconds)
        return False
    if preempt.is_set():
        return True
    with anyio.move_on_after(seconds):
        await preempt.wait()
    return preempt.is_set()


# --- summarising compaction -------------------------------------------------------------------


def _units(items: Sequence[TranscriptItem]) -> list[list[TranscriptItem]]:
    """Return ``items`` cut into units that never separate a tool call from its result.

    A tool call without a later result (or a result without an earlier call) is left out:
    a provider rejects an orphan, and dropping one half of a pair would orphan the other.
    """
    answered: set[str] = set()
    results_after: set[str] = set()
    for item in reversed(items):
        if isinstance(item, ToolResultRecord):
            results_after.add(item.id)
        elif isinstance(item, ToolCallRecord) and item.id in results_after:
            answered.add(item.id)
    units: list[list[TranscriptItem]] = []
    current: list[TranscriptItem] = []
    open_calls: set[str] = set()
    for item in items:
        if isinstance(item, ToolCallRecord):
            if item.id not in answered or item.id in open_calls:
                continue
            open_calls.add(item.id)
            answered.discard(item.id)
        elif isinstance(item, ToolResultRecord):
            if item.id not in open_calls:
                continue
            open_calls.discard(item.id)
        current.append(item)
        if not open_calls:
            units.append(current)
            current = []
    if current:  # unreachable for well-formed input; kept whole rather than split
        units.append(current)
    return units


def _carried_goal(items: Sequence[TranscriptItem]) -> str | None:
    """Return the user's goal: the one an earlier summary kept, or the first user message."""
    for item in items:
        if isinstance(item, UserMessage):
            return item.text
        if isinstance(item, ContextCompaction):
            for line in item.summary.splitlines():
                if line.startswith(GOAL_PREFIX):
                    return line[len(GOAL_PREFIX) :]
    return None


def summary_prompt(
    history: Sequence[TranscriptItem], *, budget_tokens: int | None = None
) -> list[TranscriptItem]:
    """Return the transcript of a summarising compaction call for ``history``.

    Tool calls stay with their results. When ``budget_tokens`` is given and the history is
    larger, whole units are left out from the middle: the earlier boundary, the user's goal
    (first user message) and the unit with the latest user message are always kept, then
    the most recent units that fit.
    """
    units = _units(history)
    if budget_tokens is not None:
        sizes = [estimate_transcript_tokens(u) for u in units]
        keep: set[int] = set()
        for index, unit in enumerate(units):
            if any(isinstance(i, UserMessage) for i in unit):
                keep.add(index)
                break
        for index in range(len(units) - 1, -1, -1):
            if any(isinstance(i, UserMessage) for i in units[index]):
                keep.add(index)
                break
        if units and is_compaction_boundary(units[0][0]):
            keep.add(0)
        used = sum(sizes[i] for i in keep) + estimate_item_tokens(UserMessage(SUMMARY_REQUEST))
        for index in range(len(units) - 1, -1, -1):
            if index in keep:
                continue
            if used + sizes[index] > budget_tokens:
                continue
            keep.add(index)
            used += sizes[index]
        units = [u for i, u in enumerate(units) if i in keep]
    return [*(item for unit in units for item in unit), UserMessage(SUMMARY_REQUEST)]


def summary_boundary(text: str, history: Sequence[TranscriptItem]) -> ContextCompaction:
    """Return the ``ContextCompaction`` boundary for a model's summary of ``history``.

    The user's goal and latest message are appended verbatim, so that they survive the
    compaction whatever the model wrote.
    """
    lines = [text.strip()]
    goal = _carried_goal(history)
    latest = next((i.text for i in reversed(history) if isinstance(i, UserMessage)), None)
    kept = []
    if goal is not None:
        kept.append(GOAL_PREFIX + goal)
    if latest is not None and latest != goal:
        kept.append(LATEST_PREFIX + latest)
    if kept:
        lines.append("\n".join(kept))
    return ContextCompaction("\n\n".join(lines))


# --- the transaction --------------------------------------------------------------------------


async def compact_with_provider(
    runtime: Runtime,
    thread_id: str,
    turn_id: str,
    engine_id: str | None,
    model: str | None,
    history: Sequence[TranscriptItem],
    *,
    preempt: PreemptSignal | None = None,
    record: Record | None = None,
) -> CompactionResult:
    """Compact ``history`` (the replay history of a thread) and commit the boundary.

    The boundary is committed — one atomic append of ``ItemCompleted(boundary)``, its
    ``UsageUpdated(purpose="compaction")`` and ``CompactionCommitted`` — only when the stream
    ended with ``Completed``, yielded exactly one boundary, no tool call and no ``Failed``,
    raised nothing, and ``preempt`` was not set. Retryable ``ProviderFailure`` s are retried
    (``config.reliability``); other outcomes are not. ``record`` persists (and may deliver)
    each batch; by default the events go straight to the store.

    Raise ``CompactionFailed`` (``.reason``) or ``CompactionPreempted`` after journaling the
    usage observed (purpose ``discarded_compaction``) and ``CompactionDiscarded(reason)``;
    the thread's transcript items are then exactly what they were.
    """
    engine = runtime.engine(engine_id)
    model = model or runtime.default_model(engine)
    history = list(history)
    config = runtime.config
    if engine.supports_native_compaction:
        mode = NATIVE
    elif engine.requires_native_compaction:
        raise CompactionFailed(
            f"engine {engine.id!r} requires native compaction but does not implement "
            "compact_turn; nothing was changed",
            thread_id=thread_id,
            reason="failed",
        )
    else:
        mode = SUMMARY

    async def append(events: Sequence[Event]) -> None:
        if record is None:
            await runtime.append_events(thread_id, events)
        else:
            await record(events)

    if mode == NATIVE:
        request = AgentInferenceRequest(model, config.instructions, tuple(history))
    else:
        window = await model_context_window(runtime, engine, model)
        budget = None
        if window:
            budget = window - config.compaction.summary_max_tokens
            budget = max(1, budget - estimate_transcript_tokens((), SUMMARY_INSTRUCTIONS))
        prompt = summary_prompt(history, budget_tokens=budget)
        request = AgentInferenceRequest(model, SUMMARY_INSTRUCTIONS, tuple(prompt))
    await append([CompactionStarted(turn_id, mode)])
    mark = (await runtime.get_thread(thread_id)).last_sequence
    total = TokenUsage()
    attempt_no = 0
    staged = _Attempt(mode)
    try:
        while True:
            staged = _Attempt(mode)
            if preempt is not None and preempt.is_set():
                staged.preempted = True  # steered before this attempt: no provider call
                break
            attempt_no += 1
            ctx = InferenceTurnContext(
                thread_id, turn_id, new_id("compaction"), COMPACTION, attempt_no
            )

            def open_stream(ctx: InferenceTurnContext = ctx) -> AsyncIterator[InferenceEvent]:
                if mode == NATIVE:
                    return engine.compact_turn(ctx, request)
                return engine.stream_turn(ctx, request)

            await _run_attempt(open_stream, staged, preempt)
            total = total + staged.usage
            reason = staged.verdict()
            failure = staged.failure
            if (
                reason == "disconnected"
                and failure is not None
                and should_retry(config.reliability, attempt_no, failure)
            ):
                # Bill the failed attempt durably before trying again.
                retry_events: list[Event] = []
                if not staged.usage.is_zero():
                    retry_events.append(UsageUpdated(turn_id, staged.usage, DISCARDED_COMPACTION))
                retry_events.append(
                    WarningEvent(
                        f"compaction attempt {attempt_no} failed ({failure}); retrying", turn_id
                    )
                )
                with anyio.CancelScope(shield=True):
                    await append(retry_events)
                staged = _Attempt(mode)
                delay = retry_delay(config.reliability, attempt_no, failure)
                if await _sleep_unless(preempt, delay):
                    staged.preempted = True
                    break
                continue
            break
        reason = staged.verdict()
        if reason is None and preempt is not None and preempt.is_set():
            staged.preempted = True
            reason = "preempted"
        if reason is None and await _items_added_since(runtime, thread_id, mark):
            # The thread moved on while compacting: a boundary now would hide the new items.
            staged.preempted = True
            staged.detail = "new items were added to the thread while compacting"
            reason = "preempted"
        if reason is None:
            boundary: ProviderMetadata | ContextCompaction
            if mode == NATIVE:
                assert staged.boundary is not None
                boundary = staged.boundary
            else:
                boundary = summary_boundary(staged.text, history)
            with anyio.CancelScope(shield=True):
                await append(
                    [
                        ItemCompleted(turn_id, boundary),
                        UsageUpdated(turn_id, staged.usage, COMPACTION),
                        CompactionCommitted(turn_id, mode),
                    ]
                )
            return CompactionResult(boundary, total, attempt_no, mode)
    except anyio.get_cancelled_exc_class():
        # Cancelled from outside (not by ``preempt``): still bill what was observed.
        with anyio.CancelScope(shield=True):
            await _discard(append, turn_id, staged.usage, "preempted")
        raise
    with anyio.CancelScope(shield=True):
        await _discard(append, turn_id, staged.usage, reason)
    detail = staged.detail if reason == "preempted" and staged.detail else staged.describe()
    message = (
        f"compaction of thread {thread_id} discarded ({reason}): {detail}; the history is "
        f"unchanged and the {total.total_tokens} tokens used by {attempt_no} attempt(s) "
        "were billed"
    )
    error_class = CompactionPreempted if reason == "preempted" else CompactionFailed
    raise error_class(
        message, thread_id=thread_id, reason=reason, attempts=attempt_no, usage=total
    ) from staged.failure


async def _discard(
    append: Callable[[Sequence[Event]], Awaitable[None]],
    turn_id: str,
    usage: TokenUsage,
    reason: str,
) -> None:
    events: list[Event] = []
    if not usage.is_zero():
        events.append(UsageUpdated(turn_id, usage, DISCARDED_COMPACTION))
    events.append(CompactionDiscarded(reason, turn_id))
    await append(events)


async def _items_added_since(runtime: Runtime, thread_id: str, mark: int) -> bool:
    entries = await (await runtime.store()).read_events(thread_id, after=mark)
    return any(isinstance(e.event, ItemCompleted) for e in entries)


# --- auto-compaction --------------------------------------------------------------------------


async def auto_compaction_due(
    runtime: Runtime,
    engine: InferenceEngine,
    model: str,
    history: Sequence[TranscriptItem],
    pending: Sequence[TranscriptItem] = (),
) -> bool:
    """Return True when a model call on ``history`` + ``pending`` should compact first.

    Due when the estimate passes ``compaction.auto_compact_fraction`` of the model's context
    window — unless (hysteresis) the history already starts with a boundary, less than
    :data:`REARM_FRACTION` of the window was added since, and it still fits. Never due for
    an empty history, a fraction of 0, or a model whose window is unknown.
    """
    fraction = runtime.config.compaction.auto_compact_fraction
    if fraction <= 0 or not history:
        return False
    window = await model_context_window(runtime, engine, model)
    if not window:
        return False
    instructions = runtime.config.instructions
    estimate = estimate_transcript_tokens([*history, *pending], instructions)
    if estimate <= fraction * window:
        return False
    if is_compaction_boundary(history[0]):
        added = estimate_transcript_tokens([*history[1:], *pending])
        if added < REARM_FRACTION * window and estimate <= window:
            return False
    return True


async def maybe_auto_compact(
    runtime: Runtime,
    thread_id: str,
    turn_id: str,
    engine: InferenceEngine,
    model: str,
    history: Sequence[TranscriptItem],
    *,
    pending: Sequence[TranscriptItem] = (),
    preempt: PreemptSignal | None = None,
    record: Record | None = None,
) -> list[TranscriptItem]:
    """Compact a thread before a model call when it is due; return the history to send.

    ``history`` is the thread's replay history (what is compacted); ``pending`` are items
    that will follow it in the request but are not journaled yet (the new user input): they
    count towards the estimate and are not compacted. Returns the new replay history (from
    the boundary) after a commit, else ``history`` unchanged. When the compaction fails or
    is preempted the turn goes on with ``history`` if it still fits the context window (a
    ``WarningEvent`` says so); otherwise this raises ``CompactionFailed`` (or
    ``CompactionPreempted``) with a message that says what to do.
    """
    history = list(history)
    if not await auto_compaction_due(runtime, engine, model, history, pending):
        return history
    window = await model_context_window(runtime, engine, model)
    assert window is not None
    estimate = estimate_transcript_tokens([*history, *pending], runtime.config.instructions)

    async def append(events: Sequence[Event]) -> None:
        if record is None:
            await runtime.append_events(thread_id, events)
        else:
            await record(events)

    try:
        await compact_with_provider(
            runtime, thread_id, turn_id, engine.id, model, history, preempt=preempt, record=record
        )
    except CompactionError as exc:
        if estimate <= window:
            if not isinstance(exc, CompactionPreempted):
                await append(
                    [
                        WarningEvent(
                            f"automatic compaction failed ({exc.reason}); continuing on the "
                            f"uncompacted history (~{estimate} of {window} tokens)",
                            turn_id,
                        )
                    ]
                )
            return history
        error_class = type(exc) if isinstance(exc, CompactionPreempted) else CompactionFailed
        raise error_class(
            f"the history of thread {thread_id} (~{estimate} tokens) does not fit the context "
            f"window of model {model!r} ({window} tokens) and automatic compaction did not "
            f"commit ({exc.reason}). Try again, run `roder compact {thread_id}`, or start a "
            "new thread.",
            thread_id=thread_id,
            reason=exc.reason,
            attempts=exc.attempts,
            usage=exc.usage,
        ) from exc
    compacted = await runtime.replay_history(thread_id)
    after = estimate_transcript_tokens([*compacted, *pending], runtime.config.instructions)
    if after > window:
        await append(
            [
                WarningEvent(
                    f"the history is still ~{after} tokens after compaction, more than the "
                    f"context window of model {model!r} ({window} tokens)",
                    turn_id,
                )
            ]
        )
    return compacted


async def begin_turn(
    runtime: Runtime,
    thread_id: str,
    turn_id: str,
    engine: InferenceEngine,
    model: str,
    history: Sequence[TranscriptItem],
    user_input: UserMessage,
    record: Record,
    *,
    preempt: PreemptSignal | None = None,
) -> list[TranscriptItem] | None:
    """Journal a turn's start and its user input, auto-compacting in between when due.

    Return the transcript of the turn's first model call, or None when the turn failed
    because its history does not fit and could not be compacted (``ErrorEvent`` and
    ``TurnAborted`` are journaled, after the user's input so that nothing is lost).
    ``preempt`` (set when the user steers) discards a running compaction.
    """
    if not await auto_compaction_due(runtime, engine, model, history, [user_input]):
        await record([TurnStarted(turn_id), ItemCompleted(turn_id, user_input)])
        return [*history, user_input]
    await record([TurnStarted(turn_id)])
    try:
        compacted = await maybe_auto_compact(
            runtime,
            thread_id,
            turn_id,
            engine,
            model,
            history,
            pending=[user_input],
            preempt=preempt,
            record=record,
        )
    except CompactionError as exc:
        await record(
            [
                ItemCompleted(turn_id, user_input),
                ErrorEvent(str(exc), turn_id),
                TurnAborted(turn_id, "failed"),
            ]
        )
        return None
    await record([ItemCompleted(turn_id, user_input)])
    return [*compacted, user_input]


def usage_report(usage: Mapping[str, TokenUsage]) -> dict[str, dict[str, int]]:
    """Return usage by purpose as plain JSON-ready mappings of token counts."""
    return {
        purpose: {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "cached_prompt_tokens": u.cached_prompt_tokens,
            "cache_creation_prompt_tokens": u.cache_creation_prompt_tokens,
        }
        for purpose, u in usage.items()
    }
