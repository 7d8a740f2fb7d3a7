"""``roder serve``: Roder's durable threads and runs over HTTP (docs/serve.md).

:func:`create_app` returns the ASGI app (Starlette) for a runtime; the ``roder serve``
command (hook ``register_commands``) runs it with uvicorn in one or several processes.
"""

from __future__ import annotations

from roder_server._app import ServerState, TenantState, create_app
from roder_server._protocol import ServerRuntime, ServerSession
from roder_server._runs import Dispatcher, RunStatus, fold_runs
from roder_server._settings import ServerSettings
from roder_server._stream import journal_stream, sse_message

__all__ = [
    "Dispatcher",
    "RunStatus",
    "ServerRuntime",
    "ServerSession",
    "ServerSettings",
    "ServerState",
    "TenantState",
    "create_app",
    "fold_runs",
    "journal_stream",
    "sse_message",
]
