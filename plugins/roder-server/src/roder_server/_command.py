"""``roder serve``: bind, print the listening line, run the app in one or N processes."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from roder_api.commands import Command, CommandContext
from roder_api.errors import PluginSettingsError
from roder_server._app import create_app
from roder_server._auth import DEFAULT_TENANT, parse_tokens
from roder_server._dispatch import (
    INPROCESS,
    RunDispatcher,
    UnknownDispatcherError,
    find_dispatcher,
)
from roder_server._settings import SETTINGS_ID, ServerSettings

_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``roder serve``'s arguments."""
    parser.epilog = """\
examples:
  roder serve                                 http://127.0.0.1:8321 (loopback, no tokens)
  roder serve --port 0                        a free port (the first stderr line says it)
  RODER_SERVER_TOKENS=tok1=acme,tok2 roder serve --host 0.0.0.0 --workers 4
  curl -N localhost:8321/v1/threads/ID/stream resume with -H 'Last-Event-ID: N'
(see docs/serve.md)"""
    parser.add_argument("--host", help="address to bind (default 127.0.0.1, or [server] host)")
    parser.add_argument(
        "--port", type=int, help="port (default 8321, or [server] port; 0: a free port)"
    )
    parser.add_argument(
        "--workers", type=int, help="processes serving one store (default 1, or [server] workers)"
    )
    parser.add_argument(
        "--dispatch",
        help="who answers accepted runs: inprocess (default, or [server] dispatch) or a "
        "dispatcher plugin's id, such as temporal (roder-temporal)",
    )
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)  # a worker's socket


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run(args: argparse.Namespace, context: CommandContext) -> int:
    """Run the server until SIGINT or SIGTERM; return the exit code."""
    try:
        settings = ServerSettings.from_table(context.plugin_settings.get(SETTINGS_ID))
    except PluginSettingsError as exc:
        print(f"roder serve: error: [server] {exc.setting}: {exc.reason}", file=sys.stderr)
        return 1
    keys = ("host", "port", "workers", "dispatch")
    changes = {k: getattr(args, k) for k in keys if getattr(args, k)}
    if args.port == 0:
        changes["port"] = 0
    settings = replace(settings, **changes)
    if settings.workers < 1 or not 0 <= settings.port <= 65535:
        print(
            "roder serve: error: --workers must be at least 1, --port 0 to 65535", file=sys.stderr
        )
        return 2
    tokens = parse_tokens(os.environ.get(settings.tokens_env))
    if not tokens and not _is_loopback(settings.host):
        print(
            f"roder serve: error: no tokens in ${settings.tokens_env}: refusing to listen on "
            f"{settings.host} (only loopback without tokens)",
            file=sys.stderr,
        )
        return 2
    if settings.dispatch != INPROCESS:
        try:
            find_dispatcher(settings.dispatch)
        except UnknownDispatcherError as exc:
            print(f"roder serve: error: {exc}", file=sys.stderr)
            return 2
    bad = sorted(t for t in set(tokens.values()) if t and not _TENANT.fullmatch(t))
    if bad:
        print(f"roder serve: error: bad tenant name {bad[0]!r}", file=sys.stderr)
        return 2
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
        return await _serve(sock, settings, tokens, context)
    try:
        sock, family = listen_socket(settings.host, settings.port)
    except OSError as exc:
        print(
            f"roder serve: error: cannot bind {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    port = sock.getsockname()[1]
    shown = f"[{settings.host}]" if family == socket.AF_INET6 else settings.host
    line = f"roder serve: listening on http://{shown}:{port}"
    if settings.workers == 1:
        return await _serve(sock, settings, tokens, context, announce=line)
    print(line, file=sys.stderr, flush=True)
    return await _supervise(sock, settings, context)


def listen_socket(host: str, port: int) -> tuple[socket.socket, socket.AddressFamily]:
    """Return the server's listening TCP socket, bound and listening, and its family.

    Made with ``IPPROTO_TCP`` named: asyncio sets ``TCP_NODELAY`` only on connections
    accepted from a socket whose ``proto`` says TCP. Without it every streamed event after
    the first waited for the client's delayed ACK (about 40 ms on Linux: Nagle's
    algorithm) before it was sent.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock, family


async def _serve(
    sock: socket.socket,
    settings: ServerSettings,
    tokens: Mapping[str, str],
    context: CommandContext,
    *,
    announce: str | None = None,
) -> int:
    import uvicorn

    async with AsyncExitStack() as stack:
        runtime, tenants = await stack.enter_async_context(open_tenant_runtimes(context, tokens))
        # Every lazy plugin imported now, in a worker thread, before the app serves: the
        # first run on an engine must not import its plugin on the event loop.
        await anyio.to_thread.run_sync(load_plugins, [runtime, *tenants.values()])
        tune_gc()
        remote: RunDispatcher | None = None
        if settings.dispatch != INPROCESS:
            factory = find_dispatcher(settings.dispatch)
            owner = f"roder serve ({socket.gethostname()}:{os.getpid()})"
            every = {DEFAULT_TENANT: runtime, **tenants}
            remote = await stack.enter_async_context(
                factory.open(context.plugin_settings, every, owner=owner)
            )
        app = create_app(runtime, settings, tenants=tenants, tokens=tokens, run_dispatcher=remote)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            if announce is not None:
                # Said once the app is up (its lifespan ran), so that a client that reads
                # the line finds the server answering.
                while not server.started and not server.should_exit:  # noqa: ASYNC110 - uvicorn has no event for it
                    await anyio.sleep(0.01)
                print(announce, file=sys.stderr, flush=True)
    return 0


def load_plugins(runtimes: Sequence[Any]) -> None:
    """Import every lazy plugin of the runtimes' registries (``load_all``; blocking: call it
    from a worker thread), so that no request imports one on the event loop."""
    done: set[int] = set()
    for runtime in runtimes:
        registry = runtime.registry
        if id(registry) not in done:
            done.add(id(registry))
            registry.load_all()


GC_THRESHOLDS = (10_000, 20, 20)
"""The garbage collector's thresholds in a server process (CPython's are 700, 10, 10)."""


def tune_gc() -> None:
    """Tune the garbage collector for a long-lived server, once start-up is done.

    What start-up made (modules, plugins, the registry) is frozen out of every later
    collection (``gc.freeze``), and collections run less often: with CPython's defaults a
    hundred streaming runs spent a seventh of the server's CPU collecting, in pauses of
    20-50 ms of CPU (several times that in wall time on a loaded machine), straight into the
    tail of every stream's latency. Cycles are still collected, every generation.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@asynccontextmanager
async def open_tenant_runtimes(
    context: CommandContext, tokens: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    """Open the default tenant's runtime and one per tenant named in ``tokens`` (each on
    its own store namespace, :func:`tenant_store`); yield ``(runtime, {tenant: runtime})``
    and close them all on exit. ``roder serve`` and dispatch workers open the same set.
    ``tokens`` None: read them from ``[server] tokens_env``."""
    if tokens is None:
        settings = ServerSettings.from_table(context.plugin_settings.get(SETTINGS_ID))
        tokens = parse_tokens(os.environ.get(settings.tokens_env))
    async with AsyncExitStack() as stack:
        runtime = await stack.enter_async_context(context.open_runtime())
        tenants: dict[str, Any] = {}
        for tenant in sorted({t for t in tokens.values() if t != DEFAULT_TENANT}):
            overrides = {"thread_store": tenant_store(runtime.config, tenant)}
            tenants[tenant] = await stack.enter_async_context(context.open_runtime(overrides))
        yield runtime, tenants


def tenant_store(config: Any, tenant: str) -> dict[str, Any]:
    """Return the ``[thread_store]`` keys that put ``tenant`` in a namespace of its own:
    a directory (JSONL), a file (SQLite), a schema (PostgreSQL; other backends: a
    ``tenant`` key, which they must support)."""
    backend = config.thread_store or "jsonl"
    table = dict(config.thread_store_settings)
    if backend == "postgres":
        return {"schema": f"{table.get('schema', 'roder')}_t_{tenant}"}
    if backend in ("jsonl", "sqlite"):
        home = Path(os.environ.get("RODER_HOME", "~/.roder")).expanduser()
        default = home / ("threads" if backend == "jsonl" else "threads.sqlite")
        base = Path(table.get("path") or default).expanduser()
        if backend == "jsonl":
            return {"path": str(base / "tenants" / tenant)}
        return {"path": str(base.with_name(f"{base.stem}.tenant-{tenant}{base.suffix}"))}
    return {"tenant": tenant}


async def _supervise(sock: socket.socket, settings: ServerSettings, context: CommandContext) -> int:
    """Run ``settings.workers`` processes on the one listening socket; stop them on a
    signal; restart none (a worker that exits ends the server with its code)."""
    sock.set_inheritable(True)
    command = _roder_command()
    if context.config_path:
        command += ["--config", context.config_path]
    command += ["serve", "--listen-fd", str(sock.fileno()), "--workers", "1"]
    command += ["--host", settings.host, "--port", str(settings.port)]
    command += ["--dispatch", settings.dispatch]
    children = [
        await anyio.open_process(
            command, stdin=None, stdout=None, stderr=None, pass_fds=(sock.fileno(),)
        )
        for _ in range(settings.workers)
    ]
    code = 0
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:

            async def watch(child: anyio.abc.Process) -> None:
                nonlocal code
                status = await child.wait()
                code = code or status
                tg.cancel_scope.cancel()

            for child in children:
                tg.start_soon(watch, child)
            async for _ in signals:
                tg.cancel_scope.cancel()
                break
    for child in children:
        if child.returncode is None:
            child.terminate()
    for child in children:
        with anyio.move_on_after(10) as scope:
            await child.wait()
        if scope.cancelled_caught:
            child.kill()
            await child.wait()
    return code


def _roder_command() -> list[str]:
    # The workers are the same `roder` command (it hands them the CommandContext).
    if sys.argv and os.path.basename(sys.argv[0]) == "roder" and os.path.isfile(sys.argv[0]):
        return [sys.argv[0]]
    found = shutil.which("roder")
    if found is None:
        raise RuntimeError("the roder command is not on PATH; --workers needs it")
    return [found]


SERVE = Command(
    name="serve",
    help="serve threads and runs over HTTP (resumable streams, many workers)",
    configure=configure,
    run=run,
)
"""The ``roder serve`` command."""
