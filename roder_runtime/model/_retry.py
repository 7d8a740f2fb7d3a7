"""Retry policy for provider calls: exponential backoff with jitter, a cap and ``retry_after``."""

from __future__ import annotations

import random

from roder_api.inference import ProviderFailure
from roder_runtime.config._sections import ReliabilityConfig


def retry_delay(
    config: ReliabilityConfig,
    attempt: int,
    failure: ProviderFailure | None = None,
    *,
    rng: random.Random | None = None,
) -> float:
    """Return the seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1).

    The base doubles per retry from ``provider_retry_initial_backoff_ms``, gets up to 25 %
    of jitter, and is capped at ``provider_retry_max_backoff_ms``; a provider's
    ``retry_after`` hint is honoured as a minimum (also capped).
    """
    cap = config.provider_retry_max_backoff_ms / 1000
    factor: float = 2.0 ** (attempt - 1)
    base = config.provider_retry_initial_backoff_ms / 1000 * factor
    jitter = float((rng or random).uniform(0, base * 0.25)) if base > 0 else 0.0
    delay = min(cap, base + jitter)
    if failure is not None and failure.retry_after is not None:
        delay = max(delay, min(cap, max(0.0, failure.retry_after)))
    return delay


def should_retry(config: ReliabilityConfig, attempt: int, failure: ProviderFailure) -> bool:
    """Return True when ``failure`` on attempt ``attempt`` may be retried."""
    return failure.retryable and attempt < config.provider_retry_max_attempts
