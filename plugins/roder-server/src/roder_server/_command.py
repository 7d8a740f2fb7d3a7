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
    # A worker writes a byte to this pipe once it serves (its supervisor counts start-ups).
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


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
        return await _serve(sock, settings, tokens, context, ready_fd=args.ready_fd)
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
    # Checked once here as well, so that N workers do not each fail at start five times.
    async with open_tenant_runtimes(context, tokens) as (runtime, tenants):
        await open_stores(runtime, tenants)
    return await _supervise(sock, settings, context, announce=line)


async def open_stores(runtime: Any, tenants: Mapping[str, Any]) -> None:
    """Open the store of every tenant's runtime now, so that a store id nobody installed, a
    key the store does not know or a database nobody answers stops the start with its
    one-line error (``RoderError``), rather than a server that listens and answers 503."""
    for each in (runtime, *tenants.values()):
        await each.store()


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
    ready_fd: int | None = None,
) -> int:
    import uvicorn

    if ready_fd is not None:
        os.set_inheritable(ready_fd, False)  # the worker's own: no tool's process gets it

    async with AsyncExitStack() as stack:
        runtime, tenants = await stack.enter_async_context(open_tenant_runtimes(context, tokens))
        # Each store opened before the app serves: a store id nobody installed, a key the
        # store does not know or a database nobody answers stops the start with its one-line
        # error, rather than a server that listens and answers 503 to everything.
        await open_stores(runtime, tenants)
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
            if announce is not None or ready_fd is not None:
                # Said once the app is up (its lifespan ran), so that a client that reads
                # the line finds the server answering.
                while not server.started and not server.should_exit:  # noqa: ASYNC110 - uvicorn has no event for it
                    await anyio.sleep(0.01)
                if announce is not None:
                    print(announce, file=sys.stderr, flush=True)
                if ready_fd is not None:
                    _say_ready(ready_fd, served=server.started)
    return 0


def load_plugins(runtimes: Sequence[Any]) -> None:
    """Import every lazy plugin of the runtimes' registries (``load_all``; blocking: call it
    from a worker thread), so that no request imports one on the event loop; and the
    runtime's session code, which it imports when the first session opens (that import held
    the event loop for 30-40 ms of CPU while a burst of runs queued behind it)."""
    import roder_runtime

    _ = roder_runtime.Session, roder_runtime.CompactionResult  # lazy names: imported now
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


START_FAILURES = 5
"""Workers in a row that exit before they serve, after which ``roder serve --workers``
stops (a worker that cannot start, such as one whose dispatcher is unreachable, is not
restarted forever)."""

RESTART_DELAY_S = 0.25
"""The delay before a dead worker's replacement starts; doubled for each worker in a row
that exited before it served, up to :data:`RESTART_DELAY_MAX_S`."""

RESTART_DELAY_MAX_S = 8.0
"""The longest delay before a replacement starts."""

ANNOUNCE_WAIT_S = 60.0
"""How long the listening line waits for every worker to serve (a worker slow to start
does not hide it from those that serve)."""


def _say_ready(fd: int, *, served: bool) -> None:
    # Tells the supervisor this worker serves (a byte), or not (the pipe closed empty).
    try:
        if served:
            os.write(fd, b"1")
    except OSError:
        pass  # the supervisor is gone: nobody to tell
    finally:
        os.close(fd)


async def _supervise(
    sock: socket.socket, settings: ServerSettings, context: CommandContext, *, announce: str
) -> int:
    """Run ``settings.workers`` processes on the one listening socket until SIGINT or
    SIGTERM, then stop them all; return the exit code. ``announce`` (the listening line)
    is printed once every worker serves (or failed to start; :data:`ANNOUNCE_WAIT_S` at
    most) and one does, so that a client that reads it finds all of them answering.

    A worker that dies while the server runs (a signal, a non-zero code) is replaced after
    a short delay; the others serve on untouched, and the runs the dead one held are
    answered by the store's crash rules (a surviving worker's sweep, or the replacement's
    start, finds its threads). :data:`START_FAILURES` workers in a row that exit before
    they serve stop the server with the last one's code. A worker that exits with code 0
    was asked to stop (Ctrl-C reaches the whole process group): so is the server.
    """
    sock.set_inheritable(True)
    command = _roder_command()
    if context.config_path:
        command += ["--config", context.config_path]
    command += ["serve", "--listen-fd", str(sock.fileno()), "--workers", "1"]
    command += ["--host", settings.host, "--port", str(settings.port)]
    command += ["--dispatch", settings.dispatch]
    workers = _Workers(command, sock.fileno(), settings.workers)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            for _ in range(settings.workers):
                tg.start_soon(workers.keep_one, tg.cancel_scope)
            tg.start_soon(workers.announce, announce)
            async for _ in signals:
                tg.cancel_scope.cancel()
                break
    await workers.stop()
    return workers.code


class _Workers:
    """The supervisor's worker processes: each :meth:`keep_one` keeps one running."""

    def __init__(self, command: list[str], listen_fd: int, count: int) -> None:
        self.command = command
        self.listen_fd = listen_fd
        self.starting = count
        """The first workers whose start has not ended yet (served, or exited)."""
        self.started = anyio.Event()
        self.serving = anyio.Event()
        """Set once any worker served."""
        self.running: set[anyio.abc.Process] = set()
        self.failed_starts = 0
        """Workers in a row that exited before they served."""
        self.code = 0

    async def keep_one(self, stop: anyio.CancelScope) -> None:
        """Run a worker; replace it whenever it dies, until the server stops (``stop``
        cancelled) or :data:`START_FAILURES` in a row never served."""
        first = True
        while True:
            child, ready = await self._start()
            served = await _wait_ready(ready)
            if served:
                self.serving.set()
            if first:
                first = False
                self.starting -= 1
                if not self.starting:
                    self.started.set()
            status = await child.wait()
            self.running.discard(child)
            if status == 0:
                stop.cancel()
                return
            self.failed_starts = 0 if served else self.failed_starts + 1
            how = _exit_status(status)
            what = "exited before it served" if not served else "died"
            if self.failed_starts >= START_FAILURES:
                print(
                    f"roder serve: error: worker {child.pid} {what} ({how}), the "
                    f"{START_FAILURES}th in a row to fail at start: stopping",
                    file=sys.stderr,
                    flush=True,
                )
                self.code = 128 - status if status < 0 else status
                stop.cancel()
                return
            delay = min(RESTART_DELAY_S * 2**self.failed_starts, RESTART_DELAY_MAX_S)
            print(
                f"roder serve: worker {child.pid} {what} ({how}); starting another in {delay:g} s",
                file=sys.stderr,
                flush=True,
            )
            await anyio.sleep(delay)

    async def announce(self, line: str) -> None:
        """Print ``line`` once the first workers' starts ended and one of them serves
        (never, when none ever does: the server stops saying why)."""
        with anyio.move_on_after(ANNOUNCE_WAIT_S):
            await self.started.wait()
        await self.serving.wait()
        print(line, file=sys.stderr, flush=True)

    async def _start(self) -> tuple[anyio.abc.Process, int]:
        """Start a worker; return it and the read end of its ready pipe."""
        read_fd, write_fd = os.pipe()
        try:
            with anyio.CancelScope(shield=True):  # a started worker is always in running
                child = await anyio.open_process(
                    [*self.command, "--ready-fd", str(write_fd)],
                    stdin=None,
                    stdout=None,
                    stderr=None,
                    pass_fds=(self.listen_fd, write_fd),
                )
                self.running.add(child)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return child, read_fd

    async def stop(self) -> None:
        """Terminate every worker; kill one still running 10 seconds later."""
        for child in self.running:
            if child.returncode is None:
                child.terminate()
        for child in self.running:
            with anyio.move_on_after(10) as scope:
                await child.wait()
            if scope.cancelled_caught:
                child.kill()
                await child.wait()


def _exit_status(status: int) -> str:
    # "signal SIGKILL" for -9 (a number when the signal has no name), else "code N".
    if status >= 0:
        return f"code {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"


async def _wait_ready(fd: int) -> bool:
    """Wait until a worker says it serves (True) or exits before that (False)."""
    try:
        await anyio.wait_readable(fd)
        return os.read(fd, 1) == b"1"
    finally:
        os.close(fd)


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
    loop="uvloop",
)
"""The ``roder serve`` command (on uvloop's event loop when it is installed: 0.3-0.4 ms less
to a new conversation's first delta through the OpenAI surface, benchmarks/README.md)."""
