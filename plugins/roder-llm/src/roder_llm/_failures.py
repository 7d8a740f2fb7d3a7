"""Exceptions raised by llm and its plugins, as Roder's typed provider failures.

llm plugins wrap many provider SDKs, so a failure is recognised by what it carries rather
than by its class: an HTTP status (``status_code``, ``status`` or ``response.status_code``,
as the openai, anthropic and httpx errors have), a ``Retry-After`` header, or a class name
that says timeout or connection. Anything else is ``other`` (not retried).
"""

from __future__ import annotations

from typing import Any

from roder_api.enginekit import failure_kind_for_status, parse_retry_after
from roder_api.inference import ProviderFailure, ProviderFailureKind


def _status(exc: BaseException) -> int | None:
    """Return the HTTP status an exception carries, if any."""
    for owner in (exc, getattr(exc, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(owner, name, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def _retry_after(exc: BaseException) -> float | None:
    """Return the seconds a ``Retry-After`` header on the exception's response asks for."""
    headers: Any = getattr(getattr(exc, "response", None), "headers", None)
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter("retry-after")
    return parse_retry_after(value) if isinstance(value, str) else None


def _kind_by_name(exc: BaseException) -> ProviderFailureKind:
    """Return the failure kind a class name (or its bases' names) stands for."""
    names = " ".join(cls.__name__.lower() for cls in type(exc).__mro__)
    if "timeout" in names:
        return ProviderFailureKind.TIMEOUT
    if "connect" in names or "network" in names:
        return ProviderFailureKind.NETWORK
    if "ratelimit" in names:
        return ProviderFailureKind.RATE_LIMITED
    if "authentication" in names or "permissiondenied" in names:
        return ProviderFailureKind.AUTHENTICATION
    return ProviderFailureKind.OTHER


def llm_failure(exc: BaseException, model_id: str) -> ProviderFailure:
    """Return the provider failure for an exception raised while ``model_id`` answered."""
    import llm

    if isinstance(exc, ProviderFailure):
        return exc
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    detail = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if isinstance(exc, llm.NeedsKeyException):
        return ProviderFailure(
            ProviderFailureKind.AUTHENTICATION,
            f"llm model {model_id!r} needs a key: {detail} (set it with `llm keys set`, "
            "or in the environment variable the llm plugin names)",
        )
    if isinstance(exc, llm.UnknownModelError):
        return ProviderFailure(
            ProviderFailureKind.INVALID_REQUEST,
            f"{detail}: `roder models --engine llm` lists the models llm's plugins offer",
        )
    status = _status(exc)
    kind = failure_kind_for_status(status) if status is not None else _kind_by_name(exc)
    where = f" (HTTP {status})" if status is not None else ""
    return ProviderFailure(
        kind,
        f"llm model {model_id!r} failed{where}: {type(exc).__name__}: {detail}",
        retry_after=_retry_after(exc),
    )
