"""``create_app``: the ASGI application (Starlette) around a runtime."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

from roder_api.errors import RoderError
from roder_api.threads import ThreadStore
from roder_server._auth import DEFAULT_TENANT, BodyTooLarge, GuardMiddleware, parse_tokens
from roder_server._dispatch import RunDispatcher
from roder_server._openapi import openapi_document
from roder_server._problems import Problem, error_response, from_error
from roder_server._protocol import ServerRuntime
from roder_server._routes import ROUTES, json_response
from roder_server._runs import Dispatcher
from roder_server._settings import ServerSettings
from roder_server.openai import ROUTES as OPENAI_ROUTES

STATIC = Path(__file__).parent / "static"
"""The thread browser's files (``GET /`` is ``static/index.html``)."""


@dataclass(slots=True)
class TenantState:
    """One tenant's runtime (its own store namespace) and the sessions this process holds."""

    runtime: ServerRuntime
    dispatcher: Dispatcher
    settings: ServerSettings
    owner: str
    state: ServerState

    async def store(self) -> ThreadStore:
        """Return the tenant's open store."""
        return await self.runtime.store()

    @property
    def streams(self) -> int:
        """Return the streams open in this process (all tenants)."""
        return self.state.streams

    @streams.setter
    def streams(self, value: int) -> None:
        self.state.streams = value


@dataclass(slots=True)
class ServerState:
    """What the routes reach through ``request.app.state.server``: the settings, the tenants,
    the count of open streams and, while the app runs, the task group of the streams' store
    waits (``waits``; see ``journal_stream``)."""

    settings: ServerSettings
    tenants: dict[str, TenantState] = field(default_factory=dict)
    streams: int = 0
    waits: anyio.abc.TaskGroup | None = None

    def for_request(self, request: Request) -> TenantState:
        """Return the tenant state of a request (set by the auth middleware)."""
        tenant = request.scope.get("roder.tenant", DEFAULT_TENANT)
        found = self.tenants.get(tenant)
        if found is None:
            raise Problem(401, f"tenant {tenant!r} is not served here", error="AuthenticationError")
        return found


def create_app(
    runtime: ServerRuntime,
    settings: ServerSettings | Mapping[str, Any] | None = None,
    *,
    tenants: Mapping[str, ServerRuntime] | None = None,
    tokens: Mapping[str, str] | None = None,
    routes: Sequence[BaseRoute] = (),
    run_dispatcher: RunDispatcher | None = None,
) -> Starlette:
    """Return the ASGI app serving ``runtime`` (the contract of ``docs/serve.md``).

    ``settings`` is a :class:`ServerSettings` or a ``[server]`` table. ``tenants`` maps a
    tenant name to the runtime of its own store namespace (``runtime`` is the default
    tenant's); ``tokens`` maps token to tenant (default: read from ``tokens_env``; none:
    no authentication). The lifespan owns only what it opened: the sessions it starts for
    runs (closed on shutdown), never the runtimes.

    ``run_dispatcher`` (None: in-process dispatch) schedules who answers each accepted run
    instead of this process (``roder serve --dispatch temporal``; the caller owns it).

    ``routes`` are added after the contract's (the OpenAI-compatible surface): a handler
    reaches its tenant with ``request.app.state.server.for_request(request)`` (a
    :class:`TenantState`: ``runtime``, ``dispatcher``, ``await store()``), submits a run
    with ``dispatcher.submit(...)``, reads events with ``store.read_events`` and waits for
    new ones with ``store.wait_for_events`` (or streams them with ``journal_stream``, passing
    ``task_group=request.app.state.server.waits``).
    """
    if not isinstance(settings, ServerSettings):
        settings = ServerSettings.from_table(settings)
    if tokens is None:
        tokens = parse_tokens(os.environ.get(settings.tokens_env))
    owner = f"roder serve ({socket.gethostname()}:{os.getpid()})"
    server = ServerState(settings)
    for name, tenant_runtime in {DEFAULT_TENANT: runtime, **dict(tenants or {})}.items():
        dispatcher = Dispatcher(tenant_runtime, owner=owner, remote=run_dispatcher, tenant=name)
        server.tenants[name] = TenantState(tenant_runtime, dispatcher, settings, owner, server)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            for tenant in server.tenants.values():
                await tg.start(tenant.dispatcher.run)
            try:
                async with anyio.create_task_group() as waits:
                    server.waits = waits
                    try:
                        yield
                    finally:
                        server.waits = None
                        waits.cancel_scope.cancel()
            finally:
                tg.cancel_scope.cancel()

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            with anyio.fail_after(5):
                store = await runtime.store()
                await store.list_threads(limit=1)
        except Exception as exc:  # noqa: BLE001 - any failure: not ready
            raise Problem(
                503, f"the store does not answer: {exc}", headers={"Retry-After": "5"}
            ) from None
        return json_response({"status": "ready"})

    async def openapi(request: Request) -> Response:
        return json_response(openapi_document())

    async def index(request: Request) -> Response:
        page = STATIC / "index.html"
        if not page.is_file():
            raise Problem(404, "the thread browser is not installed")
        return FileResponse(page, media_type="text/html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        path = (STATIC / name).resolve()
        if STATIC.resolve() not in path.parents or not path.is_file():
            raise Problem(404, f"no static file {name!r}")
        return FileResponse(path)

    middleware = [
        Middleware(GuardMiddleware, tokens=tokens, max_body_bytes=settings.max_body_bytes)
    ]
    if settings.cors_origins:
        middleware.insert(
            0,
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.cors_origins),
                allow_methods=["GET", "POST", "PATCH", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            ),
        )
    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/", index, methods=["GET"]),
            Route("/static/{name:path}", static, methods=["GET"]),
            *ROUTES,
            *OPENAI_ROUTES,
            *routes,
        ],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            Problem: _on_problem,
            HTTPException: _on_http,
            RoderError: _on_error,
            BodyTooLarge: _on_too_large,
            Exception: _on_error,
        },
    )
    app.state.server = server
    return app


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return error_response(request.url.path, exc)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    problem = Problem(exc.status_code, str(exc.detail), headers=headers)
    return error_response(request.url.path, problem)


async def _on_error(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, from_error(exc))


async def _on_too_large(request: Request, exc: Exception) -> Response:
    limit = exc.args[0] if exc.args else "?"
    return error_response(
        request.url.path,
        Problem(413, f"the request body is over {limit} bytes", error="InputTooLargeError"),
    )
