"""Anthropic errors mapped to ``ProviderFailure``: HTTP statuses, error types, retry hints.

The mapping itself is the engine kit's (``roder_api.enginekit.error_failure``); what is
Anthropic's here is the error body's shape, its ``error.type`` values and the phrases of a
context-window error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from roder_api.enginekit import error_failure, parse_retry_after, redact
from roder_api.enginekit.httpx_client import failure_for_exception
from roder_api.inference import ProviderFailure, ProviderFailureKind

__all__ = [
    "ERROR_KINDS",
    "error_details",
    "error_of",
    "failure_for_error",
    "failure_for_exception",
    "failure_for_status",
    "is_context_error",
    "redact",
    "retry_after_seconds",
]

ERROR_KINDS: Mapping[str, ProviderFailureKind] = {
    "overloaded_error": ProviderFailureKind.OVERLOADED,
    "api_error": ProviderFailureKind.OVERLOADED,
    "rate_limit_error": ProviderFailureKind.RATE_LIMITED,
    "authentication_error": ProviderFailureKind.AUTHENTICATION,
    "permission_error": ProviderFailureKind.AUTHENTICATION,
    "billing_error": ProviderFailureKind.AUTHENTICATION,
    "invalid_request_error": ProviderFailureKind.INVALID_REQUEST,
    "not_found_error": ProviderFailureKind.INVALID_REQUEST,
    "request_too_large": ProviderFailureKind.INVALID_REQUEST,
    "timeout_error": ProviderFailureKind.TIMEOUT,
}
"""Anthropic's ``error.type`` values and the failure kind each one is."""

_CONTEXT_PHRASES = (
    "prompt is too long",
    "context window",
    "context_length_exceeded",
    "exceed context limit",
    "input length and `max_tokens` exceed",
)
"""What an invalid-request message says when the input is over the model's window."""


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Return the server's ``retry-after`` hint in seconds (a number or an HTTP date)."""
    return parse_retry_after(headers.get("retry-after"), now)


def error_details(body: bytes) -> tuple[str | None, str]:
    """Return ``(error type, message)`` from an Anthropic error body (or plain text)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, body.decode("utf-8", errors="replace").strip()[:500]
    return error_of(data)


def error_of(data: Any) -> tuple[str | None, str]:
    """Return ``(error type, message)`` of a parsed error body or ``error`` event."""
    error = data.get("error", data) if isinstance(data, Mapping) else data
    if not isinstance(error, Mapping):
        return None, str(error)[:500]
    kind = error.get("type")
    return (str(kind) if kind else None), str(error.get("message") or "")


def is_context_error(message: str) -> bool:
    """Return True when an invalid-request message says the input is over the window."""
    lowered = message.lower()
    return any(phrase in lowered for phrase in _CONTEXT_PHRASES)


def failure_for_error(
    kind: str | None,
    message: str,
    key: str | None,
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> ProviderFailure:
    """Return the failure for an Anthropic error (an HTTP answer or a stream ``error``).

    The error's ``type`` decides the kind (:data:`ERROR_KINDS`), else the status does.
    """
    return error_failure(
        status,
        message,
        key,
        code=kind,
        kind=ERROR_KINDS.get(kind or ""),
        context_exceeded=is_context_error(message),
        retry_after=retry_after,
    )


def failure_for_status(
    status: int, headers: httpx.Headers, body: bytes, key: str | None
) -> ProviderFailure:
    """Return the failure for a non-2xx answer; the message is redacted of the key."""
    kind, message = error_details(body)
    return failure_for_error(
        kind, message, key, status=status, retry_after=retry_after_seconds(headers)
    )
