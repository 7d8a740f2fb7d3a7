"""The model-call primitive: stream one call to an engine, retry it, account its usage, bound it.

Turns (``stream_turn``), summarising compaction (``stream_turn``) and native compaction
(``compact_turn``) all call the engine through :func:`call_model`. It opens a stream per
attempt, hands every event to the caller's ``consume`` (which emits or stages it), sums the
usage of each attempt, closes the engine's stream as soon as the attempt ends, and retries a
retryable ``ProviderFailure`` with backoff when the caller's ``retryable`` allows it —
telling the caller first (``before_retry``, which journals a ``WarningEvent`` saying what
failed, attempt n of m, and when the next attempt is, and bills the failed attempt). A set
``preempt`` cancels the running attempt (and the backoff) at once; a passed ``deadline``
ends the call as timed out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from roder_api.events import UsageUpdated
from roder_api.inference import (
    Completed,
    InferenceEvent,
    ProviderFailure,
    TokenUsage,
    Usage,
    request_sent,
)
from roder_runtime.config._sections import ReliabilityConfig
from roder_runtime.model._ids import close_stream
from roder_runtime.model._retry import retry_delay, should_retry


class PreemptSignal(Protocol):
    """What ``preempt`` must offer: an event such as ``anyio.Event``."""

    def is_set(self) -> bool:
        """Return True once the call must stop."""
        ...

    async def wait(self) -> Any:
        """Return once the event is set."""
        ...


@dataclass
class Attempt:
    """One attempt of a model call: what it cost and how it ended."""

    number: int
    usage: TokenUsage = field(default_factory=TokenUsage)
    produced: bool = False
    """True once the stream yielded anything but usage (a retry would repeat output)."""
    ended: bool = False
    """True when ``consume`` said the stream ended (``Completed`` or ``Failed``)."""
    failure: ProviderFailure | None = None
    error: Exception | None = None
    """Anything else the engine raised (a bug in it): never retried."""
    preempted: bool = False
    timed_out: bool = False
    called: bool = True
    """False for an attempt preempted before it called the provider."""
    completed: Completed | None = None
    """The ``Completed`` that ended the attempt: the provider's response id and reason."""

    def billed(
        self, turn_id: str | None, purpose: str, model: str | None, provider: str | None
    ) -> UsageUpdated:
        """Return the ``UsageUpdated`` of the attempt's usage (with its response's id)."""
        return usage_updated(turn_id, self.usage, purpose, model, provider, self.completed)


def usage_updated(
    turn_id: str | None,
    usage: TokenUsage,
    purpose: str,
    model: str | None,
    provider: str | None,
    completed: Completed | None,
) -> UsageUpdated:
    """Return ``UsageUpdated`` for ``usage``, with the response's id and finish reason when
    ``completed`` (the ``Completed`` the usage was reported with) is given."""
    done = completed if completed is not None else Completed()
    return UsageUpdated(
        turn_id, usage, purpose, model, provider, done.provider_response_id, done.stop_reason
    )


@dataclass(frozen=True, slots=True)
class RetryNotice:
    """A failed attempt about to be retried: which, of how many, why, and after how long."""

    attempt: int
    max_attempts: int
    failure: ProviderFailure
    delay_s: float

    def message(self, what: str) -> str:
        """Return the warning journaled for this retry (``what``: ``model call``, ...)."""
        return (
            f"{what} attempt {self.attempt} of {self.max_attempts} failed ({self.failure}); "
            f"retrying in {self.delay_s:.1f} s"
        )


StartAttempt = Callable[[int], Awaitable[AsyncIterator[InferenceEvent]]]
"""Open the engine stream of attempt n (and journal that it starts, if the caller does)."""
Consume = Callable[[Attempt, InferenceEvent], Awaitable[bool]]
"""Emit or stage one event of an attempt; return False when the stream has ended."""
BeforeRetry = Callable[[Attempt, RetryNotice], Awaitable[None]]
"""Journal a retry (a ``WarningEvent``) and bill the failed attempt, before the backoff."""


async def call_model(
    start: StartAttempt,
    consume: Consume,
    *,
    reliability: ReliabilityConfig,
    retryable: Callable[[Attempt], bool],
    before_retry: BeforeRetry,
    preempt: PreemptSignal | None = None,
    deadline: float | None = None,
    attempts: list[Attempt] | None = None,
) -> list[Attempt]:
    """Call the model until an attempt may not be retried; return every attempt, in order.

    The last attempt says how the call ended. A retry happens only for a retryable
    ``ProviderFailure``, while attempts remain, and when ``retryable(attempt)`` agrees.
    ``attempts`` (appended to as they start) lets a caller see them even when cancelled.
    """
    if attempts is None:
        attempts = []
    while True:
        attempt = Attempt(len(attempts) + 1)
        attempts.append(attempt)
        if preempt is not None and preempt.is_set():
            # Preempted before this attempt: no provider call.
            attempt.preempted, attempt.called = True, False
            return attempts
        with anyio.CancelScope(deadline=deadline if deadline is not None else float("inf")) as sc:
            try:
                if preempt is None:
                    await _stream(start, consume, attempt)
                else:
                    await _stream_preemptible(start, consume, attempt, preempt)
            finally:
                request_sent()  # the attempt's end: nothing held back waits for it any more
        if sc.cancelled_caught and not attempt.preempted:
            attempt.timed_out = True
            return attempts
        failure = attempt.failure
        if (
            failure is None
            or attempt.preempted
            or not should_retry(reliability, attempt.number, failure)
            or not retryable(attempt)
        ):
            return attempts
        delay = retry_delay(reliability, attempt.number, failure)
        notice = RetryNotice(
            attempt.number, reliability.provider_retry_max_attempts, failure, delay
        )
        with anyio.CancelScope(shield=True):
            await before_retry(attempt, notice)
        if await _sleep_unless(preempt, delay):
            attempts.append(Attempt(len(attempts) + 1, preempted=True, called=False))
            return attempts


async def _stream(start: StartAttempt, consume: Consume, attempt: Attempt) -> None:
    try:
        stream = await start(attempt.number)
    except ProviderFailure as failure:
        attempt.failure = failure
        return
    except Exception as exc:  # noqa: BLE001 - an engine whose stream cannot even be opened
        attempt.error = exc
        return
    sent = False
    try:
        while True:
            try:
                event = await stream.__anext__()
            except StopAsyncIteration:
                return
            except ProviderFailure as failure:
                attempt.failure = failure
                return
            except Exception as exc:  # noqa: BLE001 - an engine bug ends the attempt, reported
                attempt.error = exc
                return
            if not sent:  # an event: the request was sent, whether or not the engine said so
                sent = True
                request_sent()  # (roder_api.inference.request_sent)
            if isinstance(event, Usage):
                attempt.usage = attempt.usage + event.usage
            else:
                attempt.produced = True
                if isinstance(event, Completed):
                    attempt.completed = event
            if not await consume(attempt, event):
                attempt.ended = True
                return
    finally:
        await close_stream(stream)


async def _stream_preemptible(
    start: StartAttempt, consume: Consume, attempt: Attempt, preempt: PreemptSignal
) -> None:
    async def cancel_when_set(scope: anyio.CancelScope) -> None:
        await preempt.wait()
        scope.cancel()

    raised: Exception | None = None
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(cancel_when_set, scope)
            try:
                await _stream(start, consume, attempt)
            except Exception as exc:  # noqa: BLE001 - re-raised below, not as an ExceptionGroup
                raised = exc
            finally:
                tasks.cancel_scope.cancel()
    if raised is not None:
        raise raised  # what consume raised (RecorderFullError, ...), as the caller expects
    if scope.cancelled_caught or preempt.is_set():
        attempt.preempted = True


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
