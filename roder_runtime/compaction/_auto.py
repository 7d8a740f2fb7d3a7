"""Automatic compaction: compact before a model call when the history nears the window.

:func:`maybe_auto_compact` is the hook a turn calls before a model call: it compacts when
the estimated replay size passes ``compaction.auto_compact_fraction`` of the model's context
window, with hysteresis so that it never loops.
"""

from __future__ import annotations

from collections.abc import Sequence

from roder_api.errors import CompactionError, CompactionFailed, CompactionPreempted
from roder_api.events import WarningEvent
from roder_api.inference import InferenceEngine
from roder_api.transcript import TranscriptItem, is_compaction_boundary
from roder_runtime.compaction._compaction import compact
from roder_runtime.compaction._estimates import estimate_transcript_tokens
from roder_runtime.model._call import PreemptSignal
from roder_runtime.model._catalog import ModelCatalog
from roder_runtime.store._journal import Journal

REARM_FRACTION = 0.1
"""Hysteresis: after a boundary, auto-compaction re-arms once this share of the context
window was added on top of it (or when the history no longer fits at all)."""


async def auto_compaction_due(
    catalog: ModelCatalog,
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
    fraction = catalog.config.compaction.auto_compact_fraction
    if fraction <= 0 or not history:
        return False
    window = await catalog.context_window(engine, model)
    if not window:
        return False
    estimate = estimate_transcript_tokens([*history, *pending], catalog.config.instructions)
    if estimate <= fraction * window:
        return False
    if is_compaction_boundary(history[0]):
        added = estimate_transcript_tokens([*history[1:], *pending])
        if added < REARM_FRACTION * window and estimate <= window:
            return False
    return True


async def maybe_auto_compact(
    journal: Journal,
    catalog: ModelCatalog,
    turn_id: str,
    engine: InferenceEngine,
    model: str,
    history: Sequence[TranscriptItem],
    *,
    pending: Sequence[TranscriptItem] = (),
    preempt: PreemptSignal | None = None,
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
    given, history = history, list(history)  # ``given`` keeps its read sequence
    if not await auto_compaction_due(catalog, engine, model, history, pending):
        return history
    window = await catalog.context_window(engine, model)
    assert window is not None
    instructions = catalog.config.instructions
    estimate = estimate_transcript_tokens([*history, *pending], instructions)
    try:
        await compact(
            journal,
            catalog,
            turn_id=turn_id,
            engine=engine,
            model=model,
            history=given,
            preempt=preempt,
        )
    except CompactionError as exc:
        if estimate <= window:
            if not isinstance(exc, CompactionPreempted):
                warning = (
                    f"automatic compaction failed ({exc.reason}); continuing on the "
                    f"uncompacted history (~{estimate} of {window} tokens)"
                )
                await journal.append([WarningEvent(warning, turn_id)])
            return history
        error_class = type(exc) if isinstance(exc, CompactionPreempted) else CompactionFailed
        raise error_class(
            f"the history of thread {journal.thread_id} (~{estimate} tokens) does not fit the "
            f"context window of model {model!r} ({window} tokens) and automatic compaction did "
            f"not commit ({exc.reason}). Try again, run `roder compact {journal.thread_id}`, "
            "or start a new thread.",
            thread_id=journal.thread_id,
            reason=exc.reason,
            attempts=exc.attempts,
            usage=exc.usage,
        ) from exc
    compacted = await journal.replay_history()
    after = estimate_transcript_tokens([*compacted, *pending], instructions)
    if after > window:
        warning = (
            f"the history is still ~{after} tokens after compaction, more than the context "
            f"window of model {model!r} ({window} tokens)"
        )
        await journal.append([WarningEvent(warning, turn_id)])
    return compacted
