"""Runs: the sessions this process holds, and how a run is submitted, interrupted, approved.

Each thread's turns run in the process that holds its lease. :class:`Dispatcher` opens a
session (``follow_journal=True``) on a thread when a run arrives, in a task of its own
(a session is opened and closed in one task), and closes it once idle. When another
process holds the lease, the input is journaled as ``InputAccepted`` without it (appends
never need the lease): the holder's session follows its journal and answers it. Either way
the run is accepted only once its input is journaled, and no client's disconnect cancels
it (the sessions belong to the dispatcher, not to a request).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from roder_api.codec import to_dict
from roder_api.errors import (
    BusyError,
    StoppedError,
    ThreadBusyError,
    ThreadExistsError,
)
from roder_api.events import (
    InputAccepted,
    JournalEvent,
    ToolApprovalDecided,
    ToolApprovalRequested,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import TokenUsage, ToolSpec
from roder_api.threads import ThreadStore
from roder_api.transcript import ToolResultRecord
from roder_server._dispatch import AcceptedRun, RunDispatcher
from roder_server._problems import Problem
from roder_server._protocol import ServerRuntime, ServerSession

MULTITASK = ("enqueue", "reject", "interrupt", "steer")
"""What ``multitask`` may say when a turn is running."""

_SWEEP_S = 5.0
"""How often the threads with unanswered input are looked for (beside at start)."""
_RECENT_MS = 10 * 60 * 1000
"""What a periodic sweep looks at: threads updated this recently (at start: all)."""

_IDLE_S = 2.0
"""How long a session stays open with nothing to do (it holds the thread's lease)."""


@dataclass(slots=True)
class _Held:
    engine: str | None
    model: str | None
    tools: tuple[str, ...] | None
    create: bool = False
    ready: anyio.Event = field(default_factory=anyio.Event)
    session: ServerSession | None = None
    error: BaseException | None = None
    closing: bool = False
    in_flight: int = 0
    uses: int = 0  # requests that took the session (it closes after _IDLE_S without one)


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A run's state folded from the journal (``status`` is queued, running, completed or
    aborted; ``reason`` of an abort; ``usage`` billed to the turn)."""

    thread_id: str
    turn_id: str
    status: str
    reason: str | None
    usage: TokenUsage

    def to_json(self) -> dict[str, Any]:
        """Return the JSON of ``GET .../runs/{turn_id}``."""
        body: dict[str, Any] = {
            "thread_id": self.thread_id,
            "turn_id": self.turn_id,
            "status": self.status,
            "usage": to_dict(self.usage),
        }
        if self.reason is not None:
            body["reason"] = self.reason
        return body


def fold_runs(thread_id: str, entries: Sequence[JournalEvent]) -> dict[str, RunStatus]:
    """Return every run (turn) of a journal by turn id, in journal order."""
    runs: dict[str, list[Any]] = {}
    for entry in entries:
        event = entry.event
        turn_id = getattr(event, "turn_id", None)
        if turn_id is None:
            continue
        if isinstance(event, InputAccepted) and not event.steer:
            runs.setdefault(turn_id, ["queued", None, TokenUsage()])
        elif isinstance(event, TurnStarted):
            runs.setdefault(turn_id, ["running", None, TokenUsage()])[0] = "running"
        elif isinstance(event, TurnComplete) and turn_id in runs:
            runs[turn_id][0] = "completed"
        elif isinstance(event, TurnAborted) and turn_id in runs:
            runs[turn_id][0:2] = ["aborted", event.reason]
        elif isinstance(event, UsageUpdated) and turn_id in runs:
            runs[turn_id][2] = runs[turn_id][2] + event.usage
    return {t: RunStatus(thread_id, t, s, r, u) for t, (s, r, u) in runs.items()}


def latest_approval(
    entries: Sequence[JournalEvent], call_id: str
) -> tuple[ToolApprovalRequested | None, bool]:
    """Return the newest approval request for ``call_id`` and whether it is decided.

    Call ids are the model's and may come back in a later turn (engines number them per
    turn), so a request is matched with the decision of its own turn, and only the newest
    request counts: an old turn's decision never answers a new question.
    """
    request: ToolApprovalRequested | None = None
    decided = False
    for entry in entries:
        event = entry.event
        if isinstance(event, ToolApprovalRequested) and event.call_id == call_id:
            request, decided = event, False
        elif (
            isinstance(event, ToolApprovalDecided)
            and request is not None
            and (event.turn_id, event.call_id) == (request.turn_id, call_id)
        ):
            decided = True
    return request, decided


class Dispatcher:
    """The sessions of this process, one per thread whose lease it holds.

    Start it with ``await task_group.start(dispatcher.run)`` (the app's lifespan does);
    cancelling that task group closes every session, each turn ending by the session's
    close rules (accepted input that was not answered stays journaled for the next holder).

    With a ``remote`` :class:`~roder_server.RunDispatcher` (``roder serve --dispatch
    temporal``) this process holds no session: it journals each run's input (and approval
    decisions), then hands the run to ``remote``, which schedules who answers it and sweeps
    for input nobody answers. ``tenant`` names the tenant this dispatcher serves.
    """

    def __init__(
        self,
        runtime: ServerRuntime,
        *,
        owner: str,
        remote: RunDispatcher | None = None,
        tenant: str = "",
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.remote = remote
        self.tenant = tenant
        self._held: dict[str, _Held] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Own the sessions' tasks until cancelled; pick up threads nobody answers."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            if self.remote is not None:
                await anyio.sleep_forever()  # the remote dispatcher sweeps
            await self._pick_up(since_ms=0)
            while True:
                await anyio.sleep(_SWEEP_S)
                await self._pick_up(since_ms=int(time.time() * 1000) - _RECENT_MS)

    async def _pick_up(self, *, since_ms: int) -> None:
        """Open a session on each thread with accepted input nobody answers (a store
        query): its start answers the input, or closes a dead turn by the crash rules."""
        try:
            store = await self.store()
            with anyio.fail_after(60):
                found = await store.threads_with_pending_input(updated_after_ms=since_ms)
        except Exception:  # noqa: BLE001 - tried again at the next sweep
            return
        for thread_id in found:
            if thread_id not in self._held:
                with contextlib.suppress(Exception):
                    await self._hold(thread_id, None, None, None)

    async def store(self) -> ThreadStore:
        """Return the runtime's open store."""
        return await self.runtime.store()

    # --- submitting -------------------------------------------------------------------

    async def submit(
        self,
        thread_id: str,
        text: str,
        *,
        turn_id: str | None = None,
        multitask: str = "enqueue",
        engine: str | None = None,
        model: str | None = None,
        tools: Sequence[str] | None = None,
        client_tools: Sequence[ToolSpec] = (),
        tool_results: Sequence[ToolResultRecord] = (),
        instructions: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        create: bool = False,
    ) -> tuple[str, str]:
        """Accept a run; return ``(turn_id, status)`` once its input is journaled.

        ``instructions`` replace the configured ones for this turn; like client tools they
        live in the session that runs it (503 while another process holds the thread).
        ``metadata`` is journaled with the input (its ``InputAccepted``/``TurnStarted``).
        ``create``: the thread is new, created here as its session opens
        (``Runtime.start_session(create=True)``; ``ThreadExistsError`` when the id is taken).

        Raise :class:`Problem` 409 for ``reject`` while a turn runs, 413 over
        ``max_input_bytes``, 429 when the thread's queue is full.
        """
        size = len(text.encode("utf-8"))
        limit = self.runtime.config.max_input_bytes
        if size > limit:
            raise Problem(
                413,
                f"the input is {size} bytes; the limit is {limit} (max_input_bytes)",
                error="InputTooLargeError",
            )
        turn_id = turn_id or f"turn-{uuid.uuid4().hex}"
        chosen = tuple(tools) if tools is not None else None
        if create and self.remote is not None:  # no session here: the dispatcher's answers it
            await self.runtime.create_thread(thread_id)
            create = False
        for _ in range(3):
            held = await self._hold(thread_id, engine, model, chosen, create)
            create = False  # made (else the hold raised): a session opened again just opens
            session = held.session
            if session is None:
                if client_tools or tool_results or instructions is not None:
                    if self.remote is not None:
                        raise Problem(
                            501,
                            "client tools and instructions need the in-process dispatch "
                            "(roder serve --dispatch inprocess)",
                        )
                    raise Problem(
                        503,
                        "another server process holds this thread; client tools and "
                        "instructions need it here",
                        headers={"Retry-After": "1"},
                    )
                accepted = await self._journal_input(thread_id, text, turn_id, multitask, metadata)
                await self._dispatch(thread_id, accepted[0])
                return accepted
            held.in_flight += 1
            held.uses += 1
            try:
                return await self._submit_here(
                    session,
                    text,
                    turn_id,
                    multitask,
                    client_tools,
                    tool_results,
                    instructions,
                    metadata,
                )
            except StoppedError:
                continue  # it closed meanwhile: open another
            except BusyError as exc:
                raise Problem(
                    429, str(exc), error=type(exc).__name__, headers={"Retry-After": "1"}
                ) from None
            finally:
                held.in_flight -= 1
        raise Problem(503, "the thread's session kept closing", headers={"Retry-After": "1"})

    async def _submit_here(
        self,
        session: ServerSession,
        text: str,
        turn_id: str,
        multitask: str,
        client_tools: Sequence[ToolSpec] = (),
        tool_results: Sequence[ToolResultRecord] = (),
        instructions: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, str]:
        running = session.running_turn_id
        if running is not None:
            if multitask == "reject":
                raise Problem(
                    409,
                    f"turn {running!r} is running (multitask=reject)",
                    error="ThreadBusyError",
                    running_turn_id=running,
                )
            if multitask == "steer":
                return await session.submit_input(text, steer=True), "running"
            if multitask == "interrupt":
                session.interrupt(running)
        busy = running is not None or not session.idle
        accepted = await session.submit_input(
            text,
            turn_id=turn_id,
            client_tools=client_tools,
            tool_results=tool_results,
            instructions=instructions,
            metadata=metadata,
        )
        return accepted, "queued" if busy else "running"

    async def _journal_input(
        self,
        thread_id: str,
        text: str,
        turn_id: str,
        multitask: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, str]:
        # Another process holds the lease: journal the input; its session answers it.
        store = await self.store()
        if multitask == "reject":
            runs = fold_runs(thread_id, await store.read_events(thread_id))
            running = [r.turn_id for r in runs.values() if r.status in ("running", "queued")]
            if running:
                raise Problem(
                    409,
                    f"turn {running[0]!r} is running (multitask=reject)",
                    error="ThreadBusyError",
                    running_turn_id=running[0],
                )
        await store.append_events(thread_id, [InputAccepted(turn_id, text, metadata=metadata)])
        return turn_id, "queued"

    async def _dispatch(self, thread_id: str, turn_id: str) -> None:
        if self.remote is None:
            return  # the lease holder's session follows the journal and answers it
        with contextlib.suppress(Exception):
            # Accepted is journaled: a run not scheduled now is found by the remote
            # dispatcher's sweep of threads with unanswered input.
            await self.remote.dispatch(AcceptedRun(self.tenant, thread_id, turn_id))

    # --- interrupting, approving ----------------------------------------------------------

    def local_session(self, thread_id: str) -> ServerSession | None:
        """Return this process's session on the thread, or None."""
        held = self._held.get(thread_id)
        return held.session if held is not None and not held.closing else None

    async def interrupt(self, thread_id: str, turn_id: str) -> bool:
        """Interrupt a turn; return False when another process holds the thread."""
        held = await self._hold(thread_id, None, None, None)
        if held.session is None:
            return False
        held.session.interrupt(turn_id)
        return True

    async def approve(
        self, thread_id: str, call_id: str, approved: bool, reason: str | None
    ) -> None:
        """Answer a pending approval: through this process's session, else by journaling the
        decision (the holder's session, or the next one after a restart, takes it)."""
        held = await self._hold(thread_id, None, None, None)
        if held.session is not None:
            held.session.decide_tool_call(call_id, approved, reason)
            return
        store = await self.store()
        request, decided = latest_approval(await store.read_events(thread_id), call_id)
        if request is None or decided:
            return  # the route checked it; it was decided meanwhile, nothing to add
        await store.append_events(
            thread_id, [ToolApprovalDecided(request.turn_id, call_id, approved, reason)]
        )

    # --- holding sessions -----------------------------------------------------------------

    async def _hold(
        self,
        thread_id: str,
        engine: str | None,
        model: str | None,
        tools: tuple[str, ...] | None,
        create: bool = False,
    ) -> _Held:
        if self.remote is not None:
            elsewhere = _Held(engine, model, tools)
            elsewhere.closing = True  # a session is never held here: runs are dispatched
            return elsewhere
        held = self._held.get(thread_id)
        if held is not None and not held.closing:
            if create:  # a session here: the thread exists (no run joins it unasked)
                raise ThreadExistsError(thread_id)
            await held.ready.wait()
            if held.session is not None or held.error is not None:
                return self._checked(held)
        held = _Held(engine, model, tools, create)
        self._held[thread_id] = held
        assert self._tg is not None, "the dispatcher is not running"
        self._tg.start_soon(self._keep, thread_id, held)
        await held.ready.wait()
        return self._checked(held)

    def _checked(self, held: _Held) -> _Held:
        if held.error is not None and not isinstance(held.error, ThreadBusyError):
            raise held.error
        return held

    async def _keep(self, thread_id: str, held: _Held) -> None:
        try:
            async with self.runtime.start_session(
                thread_id,
                engine=held.engine,
                model=held.model,
                owner=self.owner,
                tools=held.tools,
                follow_journal=True,
                create=held.create,
            ) as session:
                # Streams read the journal: nothing is delivered through the session (its
                # recorder never waits for a consumer, and no task wakes to drain it).
                session.stop_delivery()
                held.session = session
                held.ready.set()
                await _until_idle(held, session)
                held.closing = True
        except Exception as exc:  # noqa: BLE001 - handed to the request that asked
            held.error = exc
        finally:
            held.closing = True
            held.ready.set()
            if self._held.get(thread_id) is held:
                del self._held[thread_id]


async def _until_idle(held: _Held, session: ServerSession) -> None:
    """Return once the session had no request and nothing running for :data:`_IDLE_S`:
    looked at every 0.25 s while busy, once at the end of a quiet stretch."""
    quiet_since, uses = anyio.current_time(), held.uses
    while True:
        now = anyio.current_time()
        if held.in_flight or not session.idle or held.uses != uses:
            quiet_since, uses = now, held.uses
            await anyio.sleep(0.25)
        elif now - quiet_since < _IDLE_S:
            await anyio.sleep(quiet_since + _IDLE_S - now)
        else:
            return
