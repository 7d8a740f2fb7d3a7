"""``roder serve``: Roder's durable threads and runs over HTTP (docs/serve.md).

:func:`create_app` returns the ASGI app (Starlette) for a runtime; the ``roder serve``
command (hook ``register_commands``) runs it with uvicorn in one or several processes.
"""

from __future__ import annotations

from roder_server._app import ServerState, TenantState, create_app
from roder_server._command import open_tenant_runtimes, tenant_store
from roder_server._dispatch import (
    DISPATCH_GROUP,
    AcceptedRun,
    RunDispatcher,
    RunDispatcherFactory,
    UnknownDispatcherError,
    find_dispatcher,
)
from roder_server._protocol import ServerRuntime, ServerSession
from roder_server._runs import Dispatcher, RunStatus, fold_runs
from roder_server._settings import ServerSettings
from roder_server._stream import journal_stream, sse_message

__all__ = [
    "AcceptedRun",
    "DISPATCH_GROUP",
    "Dispatcher",
    "RunDispatcher",
    "RunDispatcherFactory",
    "RunStatus",
    "ServerRuntime",
    "ServerSession",
    "ServerSettings",
    "ServerState",
    "TenantState",
    "UnknownDispatcherError",
    "create_app",
    "find_dispatcher",
    "fold_runs",
    "journal_stream",
    "open_tenant_runtimes",
    "sse_message",
    "tenant_store",
]
