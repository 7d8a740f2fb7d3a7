"""Bearer tokens, tenants and the request-body limit, as one ASGI middleware.

Tokens come from the variable named by ``tokens_env``: ``tok`` (the default tenant) or
``tok=tenant``, comma-separated. Every token is compared with ``hmac.compare_digest`` (all
of them, so the time taken does not say which one nearly matched). ``/healthz``,
``/readyz`` and the thread browser's files (``/`` and ``/static/...``, which hold no data:
the page asks for a token) are open. A stream may carry its token as the ``access_token``
query parameter instead, because a browser's ``EventSource`` cannot set headers.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from roder_server._problems import Problem, error_response

DEFAULT_TENANT = ""
"""The tenant of a bare token (and of every request when no tokens are set)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
"""Paths answered without a token (``/static/...`` too: the page's own files)."""


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/static/")


def _query_token(scope: Scope) -> str | None:
    """Return ``access_token`` of a stream request's query (EventSource sends no headers)."""
    if scope["method"] != "GET" or not scope["path"].endswith("/stream"):
        return None
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("access_token")
    return f"Bearer {values[-1]}" if values else None


def parse_tokens(text: str | None) -> dict[str, str]:
    """Return token -> tenant from ``tok1=acme,tok2`` (a bare token: the default tenant)."""
    tokens: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        token, _, tenant = part.partition("=")
        tokens[token.strip()] = tenant.strip()
    return tokens


def tenant_of(tokens: Mapping[str, str], header: str | None) -> str | None:
    """Return the tenant of an ``Authorization`` header, or None when it is not accepted."""
    if not header or not header.startswith("Bearer "):
        return None
    given = header[len("Bearer ") :].strip().encode()
    found: str | None = None
    for token, tenant in tokens.items():
        if hmac.compare_digest(given, token.encode()):
            found = tenant
    return found


class GuardMiddleware:
    """Refuse requests without a valid token (401) and bodies over ``max_body_bytes`` (413);
    put the request's tenant in ``scope["roder.tenant"]``."""

    def __init__(self, app: ASGIApp, *, tokens: Mapping[str, str], max_body_bytes: int) -> None:
        self.app = app
        self.tokens = dict(tokens)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tenant: str | None = DEFAULT_TENANT
        if self.tokens and not _is_open(scope["path"]) and scope["method"] != "OPTIONS":
            headers = dict(scope.get("headers") or ())
            raw = headers.get(b"authorization")
            given = raw.decode("latin-1") if raw else _query_token(scope)
            tenant = tenant_of(self.tokens, given)
            if tenant is None:
                problem = Problem(
                    401,
                    "a valid bearer token is required (Authorization: Bearer <token>)",
                    error="AuthenticationError",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error_response(scope["path"], problem)(scope, receive, send)
                return
        scope = {**scope, "roder.tenant": tenant}
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _too_large(scope["path"], self.max_body_bytes)(scope, receive, send)
            return
        await self.app(scope, _limited(receive, self.max_body_bytes), send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers") or ():
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(path: str, limit: int) -> Any:
    return error_response(
        path,
        Problem(
            413,
            f"the request body is over {limit} bytes (max_body_bytes)",
            error="InputTooLargeError",
        ),
    )


class BodyTooLarge(Exception):
    """Raised while reading a body that grows over ``max_body_bytes``."""


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def limited() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return limited
