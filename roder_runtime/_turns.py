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
    UserMessage,
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
    outcome: StepOutcome | None = None,
) -> StepOutcome:
    """Stream one model call, emitting deltas, items and usage as they arrive.

    The engine's generator is closed as soon as the stream ends, fails or this task is
    cancelled. Raise ``ProviderFailure`` as the engine does; ``outcome`` (filled in as the
    stream goes, returned) keeps what was seen even then.
    """
    if outcome is None:
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


NextInput = Callable[[], Sequence[str]]
"""Return (and take) the user input that arrived for the running turn (steering)."""


def _partial(turn_id: str, outcome: StepOutcome) -> list[Event]:
    """Return the items that keep a failed step's delivered text, marked as interrupted."""
    if not outcome.text:
        return []
    return [ItemCompleted(turn_id, AssistantMessage(outcome.text, interrupted=True))]


async def run_turn(
    engine: InferenceEngine,
    config: RuntimeConfig,
    *,
    thread_id: str,
    turn_id: str,
    model: str,
    transcript: Sequence[TranscriptItem],
    emit: Emit,
    next_input: NextInput | None = None,
) -> str | None:
    """Run the model steps of one turn and emit its events; return the assistant's text.

    A retryable ``ProviderFailure`` before any output of a step retries the step with
    backoff; afterwards, or when not retryable, the turn ends with ``ErrorEvent`` and
    ``TurnAborted`` (the text already delivered is kept, marked interrupted). Usage is
    emitted as observed, so every attempt is billed. After a completed step, input from
    ``next_input`` (the user steering) is added to the turn and the model called again.
    """
    history = list(transcript)
    last_text: str | None = None
    while True:
        request = AgentInferenceRequest(
            model=model, instructions=config.instructions, transcript=tuple(history)
        )
        attempt = 1
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

            outcome = StepOutcome()
            try:
                await run_model_step(engine, ctx, request, tracking_emit, outcome)
            except ProviderFailure as failure:
                if not produced and should_retry(config.reliability, attempt, failure):
                    await anyio.sleep(retry_delay(config.reliability, attempt, failure))
                    attempt += 1
                    continue
                await emit(
                    [
                        *_partial(turn_id, outcome),
                        ErrorEvent(f"model call failed: {failure}", turn_id),
                        TurnAborted(turn_id, "failed"),
                    ]
                )
                return None
            break
        if outcome.failure is not None or not outcome.completed:
            message = (
                f"model call failed: {outcome.failure}"
                if outcome.failure is not None
                else "the model stream ended without completing"
            )
            await emit(
                [
                    *_partial(turn_id, outcome),
                    ErrorEvent(message, turn_id),
                    TurnAborted(turn_id, "failed"),
                ]
            )
            return None
        final: list[Event] = []
        step_items: list[TranscriptItem] = list(outcome.items)
        if outcome.reasoning:
            step_items.append(Reasoning(outcome.reasoning))
            final.append(ItemCompleted(turn_id, Reasoning(outcome.reasoning)))
        if outcome.text:
            last_text = outcome.text
            step_items.append(AssistantMessage(outcome.text))
            final.append(ItemCompleted(turn_id, AssistantMessage(outcome.text)))
        steering = list(next_input()) if next_input is not None else []
        if steering:
            messages = [UserMessage(text) for text in steering]
            final += [ItemCompleted(turn_id, message) for message in messages]
            await emit(final)
            history += [*step_items, *messages]
            continue
        final.append(TurnComplete(turn_id, last_text))
        await emit(final)
        return last_text if last_text is not None else ""
