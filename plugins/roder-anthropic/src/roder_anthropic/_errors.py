"""Anthropic errors mapped to ``ProviderFailure``: HTTP statuses, error types, retry hints."""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from roder_api.inference import ProviderFailure, ProviderFailureKind

_KEY_PATTERN = re.compile(r"\bsk-ant-[A-Za-z0-9_\-*.]{4,}|\b(?:sk|rk|pk)-[A-Za-z0-9_\-*.]{4,}")
"""Things that look like API keys (also the masked ones some proxies echo back)."""

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


def redact(text: str, key: str | None) -> str:
    """Return ``text`` with the API key, and anything shaped like a key, blanked out."""
    if key:
        text = text.replace(key, "[redacted]")
    return _KEY_PATTERN.sub("[redacted]", text)


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Return the server's ``retry-after`` hint in seconds (a number or an HTTP date)."""
    after = headers.get("retry-after")
    if after is None:
        return None
    try:
        value = float(after)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(after)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return value if value >= 0 else None


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
    """Return the failure for an Anthropic error (an HTTP answer or a stream ``error``)."""
    said = redact(message, key) or (httpx.codes.get_reason_phrase(status) if status else "error")
    text = (f"HTTP {status}" if status else "the stream reported an error") + (
        f" ({kind})" if kind else ""
    )
    text += f": {said}"
    failure_kind = ERROR_KINDS.get(kind or "")
    if failure_kind is None:
        if status == 429:
            failure_kind = ProviderFailureKind.RATE_LIMITED
        elif status is not None and status >= 500:
            failure_kind = ProviderFailureKind.OVERLOADED  # 529 is Anthropic's "overloaded"
        elif status in (401, 403):
            failure_kind = ProviderFailureKind.AUTHENTICATION
        elif status is not None and status >= 300:
            failure_kind = ProviderFailureKind.INVALID_REQUEST
        else:
            failure_kind = ProviderFailureKind.OTHER
    if failure_kind is ProviderFailureKind.INVALID_REQUEST and is_context_error(message):
        failure_kind = ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED
    if not failure_kind.retryable:
        retry_after = None
    return ProviderFailure(failure_kind, text, retry_after=retry_after)


def failure_for_status(
    status: int, headers: httpx.Headers, body: bytes, key: str | None
) -> ProviderFailure:
    """Return the failure for a non-2xx answer; the message is redacted of the key."""
    kind, message = error_details(body)
    return failure_for_error(
        kind, message, key, status=status, retry_after=retry_after_seconds(headers)
    )


def failure_for_exception(error: httpx.HTTPError, *, streaming: bool) -> ProviderFailure:
    """Return the failure for a transport error; ``streaming``: after the answer began."""
    name = type(error).__name__
    if isinstance(error, httpx.TimeoutException):
        return ProviderFailure(ProviderFailureKind.TIMEOUT, f"the request timed out ({name})")
    if streaming:
        return ProviderFailure(
            ProviderFailureKind.STREAM_INTERRUPTED,
            f"the response stream was cut before it completed ({name})",
        )
    if isinstance(error, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)):
        return ProviderFailure(
            ProviderFailureKind.NETWORK, f"could not reach the server ({name}: {error})"
        )
    return ProviderFailure(ProviderFailureKind.OTHER, f"HTTP client error ({name}: {error})")
