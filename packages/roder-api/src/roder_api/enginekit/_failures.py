"""HTTP answers as ``ProviderFailure`` values: status mapping, retry hints, redaction, and the
refusal of input that cannot fit a model's context window.

Everything here takes plain values (a status, header values, a message), so that it serves
an engine whatever HTTP client it uses.
"""

from __future__ import annotations

import email.utils
import http
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from roder_api.inference import ProviderFailure, ProviderFailureKind

KEY_PATTERN = re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_\-*.]{4,}")
"""Things that look like API keys (``sk-...``, ``sk-ant-...``, and the masked ones some
servers echo back): blanked out of every message by :func:`redact`."""

MAX_ERROR_BODY = 64 * 1024
"""How much of an error answer's body is kept to explain the failure."""

CHARS_PER_TOKEN_ESTIMATE = 4
"""Characters per token for the size reported when input is refused as too large."""

CHARS_PER_TOKEN_BOUND = 6
"""Characters per token for the refusal itself: a generous bound, so that only input that
certainly cannot fit is refused (dense text has fewer characters per token, not more)."""


def redact(text: str, key: str | None) -> str:
    """Return ``text`` with the API key, and anything shaped like a key, blanked out."""
    if key:
        text = text.replace(key, "[redacted]")
    return KEY_PATTERN.sub("[redacted]", text)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Return a ``Retry-After`` header value in seconds: a number, or an HTTP date.

    None for no value, an unreadable one or a negative number; a date in the past is 0.
    ``now`` (a POSIX time) is for tests.
    """
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if seconds >= 0 else None


def parse_retry_after_ms(value: str | None) -> float | None:
    """Return a ``retry-after-ms`` header value (milliseconds) in seconds, or None."""
    if value is None:
        return None
    try:
        seconds = float(value) / 1000.0
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def reason_phrase(status: int) -> str:
    """Return the standard reason phrase of an HTTP status ("" for one without)."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def failure_kind_for_status(status: int | None) -> ProviderFailureKind:
    """Return the failure kind an HTTP status stands for.

    429: rate limited; 5xx (529 included): overloaded; 401 and 403: authentication; any
    other status from 300 up: invalid request; None (an error reported inside a stream) or
    a success status: other.
    """
    if status is None or status < 300:
        return ProviderFailureKind.OTHER
    if status == 429:
        return ProviderFailureKind.RATE_LIMITED
    if status >= 500:
        return ProviderFailureKind.OVERLOADED
    if status in (401, 403):
        return ProviderFailureKind.AUTHENTICATION
    return ProviderFailureKind.INVALID_REQUEST


def error_failure(
    status: int | None,
    message: str,
    key: str | None,
    *,
    code: str | None = None,
    kind: ProviderFailureKind | None = None,
    context_exceeded: bool = False,
    retry_after: float | None = None,
) -> ProviderFailure:
    """Return the failure for an error answer (``status``) or a stream's error (None).

    The message reads ``HTTP 429 (rate_limit_error): <message>`` (``the stream reported an
    error (...)`` without a status), redacted of ``key`` and of anything shaped like a key;
    an empty message falls back to the status's reason phrase. ``kind`` overrides the
    kind of the status (the provider's own error type, mapped); an invalid request that
    says the input is too long (``context_exceeded``) is ``CONTEXT_WINDOW_EXCEEDED``.
    ``retry_after`` is kept only for a retryable kind.
    """
    said = redact(message, key) or (reason_phrase(status) if status else "") or "error"
    text = f"HTTP {status}" if status else "the stream reported an error"
    text += (f" ({code})" if code else "") + f": {said}"
    failure_kind = kind if kind is not None else failure_kind_for_status(status)
    if failure_kind is ProviderFailureKind.INVALID_REQUEST and context_exceeded:
        failure_kind = ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED
    if not failure_kind.retryable:
        retry_after = None
    return ProviderFailure(failure_kind, text, retry_after=retry_after)


def transport_failure(
    error: BaseException,
    *,
    timed_out: bool,
    unreachable: bool,
    streaming: bool,
    where: str = "",
) -> ProviderFailure:
    """Return the failure for an HTTP client's transport error.

    ``timed_out``: a connect, read or write timeout (``TIMEOUT``); ``streaming``: the answer
    had begun (``STREAM_INTERRUPTED``); ``unreachable``: the server could not be reached or
    spoke broken HTTP (``NETWORK``); anything else is ``OTHER``. ``where`` (``engine
    'ollama' at http://127.0.0.1:11434/v1``) leads the message, so that a person knows which
    server to look at.
    """
    name = type(error).__name__
    lead = f"{where}: " if where else ""
    if timed_out:
        return ProviderFailure(ProviderFailureKind.TIMEOUT, f"{lead}the request timed out ({name})")
    if streaming:
        return ProviderFailure(
            ProviderFailureKind.STREAM_INTERRUPTED,
            f"{lead}the response stream was cut before it completed ({name})",
        )
    if unreachable:
        return ProviderFailure(
            ProviderFailureKind.NETWORK, f"{lead}could not reach the server ({name}: {error})"
        )
    return ProviderFailure(ProviderFailureKind.OTHER, f"{lead}HTTP client error ({name}: {error})")


def text_characters(value: Any, skip: frozenset[str] = frozenset()) -> int:
    """Return how many characters of text ``value`` (a request's input, any JSON) holds.

    Values under keys in ``skip`` (opaque ciphertext, ids, types) are not counted.
    """
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(text_characters(v, skip) for k, v in value.items() if k not in skip)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return sum(text_characters(v, skip) for v in value)
    return 0


def check_fits(model: str, window: int | None, characters: int) -> None:
    """Raise ``CONTEXT_WINDOW_EXCEEDED`` when ``characters`` of input cannot fit ``window``.

    Call it before sending: a request the server must refuse is refused here, with its
    size, and is not retried. Only input over :data:`CHARS_PER_TOKEN_BOUND` characters per
    token of the window is refused; no window (None) refuses nothing.
    """
    if not window or characters // CHARS_PER_TOKEN_BOUND <= window:
        return
    estimate = -(-characters // CHARS_PER_TOKEN_ESTIMATE)
    raise ProviderFailure(
        ProviderFailureKind.CONTEXT_WINDOW_EXCEEDED,
        f"the request is about {estimate} tokens ({characters} characters of text), more "
        f"than the context window of model {model!r} ({window} tokens); nothing was sent. "
        "Shorten the message, or compact or start a new thread",
    )
