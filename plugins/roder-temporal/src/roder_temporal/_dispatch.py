"""The Temporal run dispatcher (``roder serve --dispatch temporal``) and the worker it runs.

:class:`TemporalDispatcher` starts one workflow per accepted run, its id made of the
tenant, thread and turn (:func:`~roder_temporal._workflow.workflow_id`), so a second start
of one run joins the first. It also sweeps the stores for accepted input that has no run
scheduled (the accepting process died between journaling and starting the workflow):
the same start, harmless when it is scheduled already.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from roder_server import AcceptedRun, ServerRuntime
from roder_temporal._activity import RunAnswerer
from roder_temporal._settings import SETTINGS_ID, TemporalSettings
from roder_temporal._workflow import WORKFLOW, RunRef, RunWorkflow, workflow_id

_SWEEP_S = 5.0
"""How often the stores are swept for input with no run scheduled (beside at start)."""
_RECENT_MS = 10 * 60 * 1000
"""What a periodic sweep looks at: threads updated this recently (at start: all)."""
_SHUTDOWN_S = 5.0
"""How long a stopping worker lets its activities finish before cancelling them (their
sessions then close by the close rules; Temporal retries them elsewhere)."""


async def connect(settings: TemporalSettings) -> Client:
    """Return a client of the Temporal service ``settings`` names."""
    return await Client.connect(settings.address, namespace=settings.namespace)


class TemporalDispatcher:
    """Schedules each accepted run as a Temporal workflow (``roder_server.RunDispatcher``)."""

    def __init__(
        self, client: Client, settings: TemporalSettings, runtimes: Mapping[str, ServerRuntime]
    ) -> None:
        self.client = client
        self.settings = settings
        self.runtimes = dict(runtimes)

    async def dispatch(self, run: AcceptedRun) -> None:
        """Start the run's workflow (or join it, when it was started already)."""
        ref = RunRef(run.tenant, run.thread_id, run.turn_id, self.settings.heartbeat_timeout_s)
        with anyio.fail_after(30):
            await self.client.start_workflow(
                WORKFLOW,
                ref,
                id=workflow_id(run.tenant, run.thread_id, run.turn_id),
                task_queue=self.settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            )

    async def sweep(self, *, since_ms: int) -> int:
        """Dispatch every run of a thread with unanswered input (updated since
        ``since_ms``) that has not ended; return how many were dispatched."""
        count = 0
        for tenant, runtime in self.runtimes.items():
            with contextlib.suppress(Exception):  # tried again at the next sweep
                store = await runtime.store()
                with anyio.fail_after(60):
                    found = await store.threads_with_pending_input(updated_after_ms=since_ms)
                for thread_id in found:
                    # The turns accepted or started and not ended, kept in the metadata.
                    for turn_id in (await store.get_thread(thread_id)).open_turns:
                        await self.dispatch(AcceptedRun(tenant, thread_id, turn_id))
                        count += 1
        return count

    async def sweep_forever(self) -> None:
        """Sweep at start (every thread), then every few seconds (recent threads)."""
        await self.sweep(since_ms=0)
        while True:
            await anyio.sleep(_SWEEP_S)
            await self.sweep(since_ms=int(time.time() * 1000) - _RECENT_MS)


@asynccontextmanager
async def running_worker(
    client: Client,
    settings: TemporalSettings,
    runtimes: Mapping[str, ServerRuntime],
    *,
    owner: str,
    announce: Callable[[str], None] | None = None,
) -> AsyncIterator[Worker]:
    """Run a worker of ``settings.task_queue`` for the block; stop it gracefully on exit."""
    answerer = RunAnswerer(runtimes, owner=owner, announce=announce)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[RunWorkflow],
        activities=[answerer.answer_run],
        # The workflow only calls one activity (deterministic by construction) and its
        # module imports the SDK alone; the sandbox would re-import roder's packages.
        workflow_runner=UnsandboxedWorkflowRunner(),
        graceful_shutdown_timeout=timedelta(seconds=_SHUTDOWN_S),
    )

    async def run() -> None:
        # Shielded: only shutdown() below ends it (the SDK's own shutdown must not be
        # cancelled halfway by the cancel scope that is closing the block).
        with anyio.CancelScope(shield=True):
            await worker.run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            yield worker
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_SHUTDOWN_S + 10):
                await worker.shutdown()


class TemporalDispatcherFactory:
    """The ``temporal`` entry of ``roder_server.dispatchers`` (``roder_server.
    RunDispatcherFactory``): a dispatcher on the ``[temporal]`` table's service, and the
    process's worker unless ``[temporal] worker = false``."""

    id = "temporal"

    @asynccontextmanager
    async def open(
        self,
        settings: Mapping[str, Mapping[str, Any]],
        runtimes: Mapping[str, ServerRuntime],
        *,
        owner: str,
    ) -> AsyncIterator[TemporalDispatcher]:
        """Connect, start the worker (when configured) and the sweep; yield the dispatcher."""
        config = TemporalSettings.from_table(settings.get(SETTINGS_ID))
        client = await connect(config)
        dispatcher = TemporalDispatcher(client, config, runtimes)
        async with contextlib.AsyncExitStack() as stack:
            if config.worker:
                await stack.enter_async_context(
                    running_worker(client, config, runtimes, owner=owner)
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(dispatcher.sweep_forever)
                try:
                    yield dispatcher
                finally:
                    tg.cancel_scope.cancel()


FACTORY = TemporalDispatcherFactory()
"""The object the ``roder_server.dispatchers`` entry point ``temporal`` names."""
