"""One turn: replay history plus the user's input to an engine, its stream mapped to events."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    Event,
    ItemCompleted,
    ModelStepStarted,
    TurnAborted,
    TurnComplete,
    UsageUpdated,
)
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceEngine,
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
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    TranscriptItem,
)
from roder_runtime._config import RuntimeConfig
from roder_runtime._retry import retry_delay, should_retry

Emit = Callable[[Sequence[Event]], Awaitable[None]]
"""Persist (and deliver) a batch of events, in order."""


def new_id(prefix: str) -> str:
    """Return a fresh id such as ``turn_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


async def close_stream(stream: AsyncIterator[object]) -> None:
    """Close an engine's stream at once (shielded, so it also runs while cancelling)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


@dataclass
class StepOutcome:
    """What one model step produced."""

    text: str = ""
    reasoning: str = ""
    items: list[TranscriptItem] = field(default_factory=list)
    usage: TokenUsage = field(default_factory=TokenUsage)
    completed: bool = False
    failure: str | None = None


async def run_model_step(
    engine: InferenceEngine,
    ctx: InferenceTurnContext,
    request: AgentInferenceRequest,
    emit: Emit,
) -> StepOutcome:
    """Stream one model call, emitting deltas, items and usage as they arrive.

    The engine's generator is closed as soon as the stream ends or this task is cancelled.
    Raise ``ProviderFailure`` as the engine does; the outcome keeps what was seen.
    """
    outcome = StepOutcome()
    stream = engine.stream_turn(ctx, request)
    turn_id, step_id = ctx.turn_id, ctx.model_step_id
    try:
        async for event in stream:
            if isinstance(event, MessageDelta):
                if event.text:
                    outcome.text += event.text
                    await emit(
                        [
                            AssistantContentDelta(
                                turn_id, step_id, ContentPhase.FINAL_ANSWER, event.text
                            )
                        ]
                    )
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    outcome.reasoning += event.text
                    await emit(
                        [
                            AssistantContentDelta(
                                turn_id, step_id, ContentPhase.REASONING, event.text
                            )
                        ]
                    )
            elif isinstance(event, ToolCallCompleted):
                item = ToolCallRecord(event.id, event.name, event.arguments)
                outcome.items.append(item)
                await emit([ItemCompleted(turn_id, item)])
            elif isinstance(event, Usage):
                outcome.usage = outcome.usage + event.usage
                await emit([UsageUpdated(turn_id, event.usage, "turn")])
            elif isinstance(event, ProviderMetadata):
                outcome.items.append(event)
                await emit([ItemCompleted(turn_id, event)])
            elif isinstance(event, Completed):
                outcome.completed = True
                break
            elif isinstance(event, Failed):
                outcome.failure = event.message
                break
            else:
                raise TypeError(
                    f"engine {engine.id!r} yielded {type(event).__name__}, not an inference event"
                )
    finally:
        await close_stream(stream)
    return outcome


async def run_turn(
    engine: InferenceEngine,
    config: RuntimeConfig,
    *,
    thread_id: str,
    turn_id: str,
    model: str,
    transcript: Sequence[TranscriptItem],
    emit: Emit,
) -> str | None:
    """Run the model steps of one turn and emit its events; return the assistant's text.

    A retryable ``ProviderFailure`` before any output of a step retries the step with
    backoff; afterwards, or when not retryable, the turn ends with ``ErrorEvent`` and
    ``TurnAborted``. Usage is emitted as observed, so every attempt is billed.
    """
    attempt = 1
    request = AgentInferenceRequest(
        model=model, instructions=config.instructions, transcript=tuple(transcript)
    )
    while True:
        step_id = new_id("step")
        await emit([ModelStepStarted(turn_id, step_id)])
        ctx = InferenceTurnContext(thread_id, turn_id, step_id, "turn", attempt)
        produced = False

        async def tracking_emit(events: Sequence[Event]) -> None:
            nonlocal produced
            if any(not isinstance(e, UsageUpdated) for e in events):
                produced = True
            await emit(events)

        try:
            outcome = await run_model_step(engine, ctx, request, tracking_emit)
        except ProviderFailure as failure:
            if not produced and should_retry(config.reliability, attempt, failure):
                await anyio.sleep(retry_delay(config.reliability, attempt, failure))
                attempt += 1
                continue
            await emit(
                [
                    ErrorEvent(f"model call failed: {failure}", turn_id),
                    TurnAborted(turn_id, "failed"),
                ]
            )
            return None
        break
    final: list[Event] = []
    if outcome.reasoning:
        final.append(ItemCompleted(turn_id, Reasoning(outcome.reasoning)))
    if outcome.text:
        final.append(ItemCompleted(turn_id, AssistantMessage(outcome.text)))
    if outcome.failure is not None:
        final += [
            ErrorEvent(f"model call failed: {outcome.failure}", turn_id),
            TurnAborted(turn_id, "failed"),
        ]
        await emit(final)
        return None
    if not outcome.completed:
        final += [
            ErrorEvent("the model stream ended without completing", turn_id),
            TurnAborted(turn_id, "failed"),
        ]
        await emit(final)
        return None
    final.append(TurnComplete(turn_id, outcome.text or None))
    await emit(final)
    return outcome.text
