"""Errors as ``application/problem+json`` (RFC 9457) with Roder's error class in ``error``
(and, on the OpenAI-compatible routes, in the OpenAI error shape: :func:`error_response`)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from roder_api.errors import (
    BusyError,
    InputTooLargeError,
    InvalidThreadIdError,
    MisconfiguredPluginError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnknownPluginIdError,
)

PROBLEM_TYPE = "application/problem+json"

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """Raised by a route to answer with a problem document (``status``, ``detail``, the
    Roder error class ``error``, extra ``headers`` such as ``Retry-After``)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        error: str = "RequestError",
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.error = error
        self.headers = headers or {}
        self.extra = extra


def problem_response(problem: Problem) -> Response:
    """Return the response for ``problem``."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(problem.status, "Error"),
        "status": problem.status,
        "detail": problem.detail,
        "error": problem.error,
        **problem.extra,
    }
    return Response(
        orjson.dumps(body),
        status_code=problem.status,
        media_type=PROBLEM_TYPE,
        headers=problem.headers,
    )


OPENAI_PREFIXES = ("/v1/responses", "/v1/conversations", "/v1/models")
"""The paths of the OpenAI-compatible surface (and everything under them)."""

_OPENAI_CODES = {
    "AuthenticationError": "invalid_api_key",
    "InputTooLargeError": "request_too_large",
}


def is_openai_path(path: str) -> bool:
    """Return True for a path of the OpenAI-compatible surface."""
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PREFIXES)


def error_response(path: str, problem: Problem) -> Response:
    """Return the answer of ``problem`` to a request for ``path``: problem+json, or on the
    OpenAI routes ``{"error": {"message", "type", "param", "code"}}`` (what the ``openai``
    SDK and other clients of that API parse), with the same status and headers."""
    if not is_openai_path(path):
        return problem_response(problem)
    kind = "invalid_request_error" if problem.status < 500 else "server_error"
    body = {
        "error": {
            "message": problem.detail,
            "type": kind,
            "param": None,
            "code": _OPENAI_CODES.get(problem.error),
        }
    }
    return Response(
        orjson.dumps(body),
        status_code=problem.status,
        media_type="application/json",
        headers=problem.headers,
    )


def from_error(exc: Exception) -> Problem:
    """Return the problem for a Roder error (or any other exception: a 500)."""
    name = type(exc).__name__
    if isinstance(exc, ThreadNotFoundError):
        return Problem(404, str(exc), error=name)
    if isinstance(exc, InvalidThreadIdError):
        return Problem(400, str(exc), error=name)
    if isinstance(exc, ThreadExistsError):
        return Problem(409, str(exc), error=name)
    if isinstance(exc, InputTooLargeError):
        return Problem(413, str(exc), error=name)
    if isinstance(exc, BusyError):
        return Problem(409, str(exc), error=name)
    if isinstance(exc, (UnknownPluginIdError, MisconfiguredPluginError)):
        return Problem(422, str(exc), error=name)
    if isinstance(exc, StoreError):
        return Problem(503, str(exc), error=name, headers={"Retry-After": "1"})
    return Problem(500, f"{name}: {exc}", error=name)


def not_found(thread_id: str) -> Problem:
    """Return the 404 of a thread that does not exist (or belongs to another tenant)."""
    return Problem(404, f"thread {thread_id!r} not found", error="ThreadNotFoundError")
