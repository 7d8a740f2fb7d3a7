"""The activity: take the thread's lease, answer its accepted input, heartbeat meanwhile.

It opens a normal session (``follow_journal=True``) on the run's thread, as the in-process
dispatcher does: the session's start closes a dead session's turn by the crash rules (a
turn left in a tool step goes on; a non-idempotent call started without a result gets an
error result) and answers the input accepted and never answered, in order; input journaled
meanwhile is answered too. The activity returns once its own run has ended and the session
has nothing left to do. Another session holding the thread is a retryable failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import anyio
from temporalio import activity
from temporalio.exceptions import ApplicationError

from roder_api.errors import RoderError, ThreadBusyError, ThreadNotFoundError
from roder_api.events import TurnAborted, TurnComplete
from roder_api.threads import ThreadStore
from roder_server import ServerRuntime, ServerSession, fold_runs
from roder_temporal._workflow import ACTIVITY, RunRef

ENDED = ("completed", "aborted")
"""The statuses of a run that has ended."""

_QUIET_S = 0.5
"""How long the session must stay idle after the run ended before the activity returns."""
_CHECK_S = 1.0
"""How often the journal is read for the run's status (beside the session's events)."""


class RunAnswerer:
    """The activity's implementation over the runtimes of this worker (tenant name to
    runtime; ``""`` is the default tenant). ``announce`` (optional) is told each run it
    starts answering, one line."""

    def __init__(
        self,
        runtimes: Mapping[str, ServerRuntime],
        *,
        owner: str,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.runtimes = dict(runtimes)
        self.owner = owner
        self.announce = announce

    @activity.defn(name=ACTIVITY)
    async def answer_run(self, ref: RunRef) -> str:
        """Answer the thread of ``ref`` until its run has ended; return its status."""
        runtime = self.runtimes.get(ref.tenant)
        if runtime is None:
            raise ApplicationError(
                f"tenant {ref.tenant!r} is not served by this worker", type="UnknownTenant"
            )
        try:
            store = await runtime.store()
            status = await _status(store, ref)
            if status in ENDED:
                return status
            async with runtime.start_session(
                ref.thread_id, owner=self.owner, follow_journal=True
            ) as session:
                if self.announce is not None:
                    self.announce(f"answering thread {ref.thread_id} (run {ref.turn_id})")
                return await _answer(session, store, ref)
        except ThreadBusyError as exc:
            # Another session holds the thread: it answers the journaled input; this
            # attempt is retried and then finds the run ended (or the lease free).
            raise ApplicationError(str(exc), type="ThreadBusyError") from None
        except ThreadNotFoundError as exc:
            raise ApplicationError(str(exc), type="ThreadNotFoundError") from None


async def _status(store: ThreadStore, ref: RunRef) -> str:
    # The metadata's open turns say "not ended" without reading the journal (this is asked
    # every second while the run goes on); only an ended run is folded to tell how it ended.
    if ref.turn_id in (await store.get_thread(ref.thread_id)).open_turns:
        return "open"
    runs = fold_runs(ref.thread_id, await store.read_events(ref.thread_id))
    run = runs.get(ref.turn_id)
    return "missing" if run is None else run.status


async def _answer(session: ServerSession, store: ThreadStore, ref: RunRef) -> str:
    interval = max(0.1, min(1.0, ref.heartbeat_timeout_s / 3))
    ended: list[str] = []

    async def drain() -> None:
        # Streams read the journal; the session's own delivery is drained so that its
        # recorder never waits for a consumer. The run's end is seen here first.
        with contextlib.suppress(RoderError):
            while True:
                event = (await session.next_event()).event
                if isinstance(event, (TurnComplete, TurnAborted)) and (
                    event.turn_id == ref.turn_id
                ):
                    ended.append("completed" if isinstance(event, TurnComplete) else "aborted")

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        quiet = checked = 0.0
        while True:
            activity.heartbeat()
            await anyio.sleep(interval)
            checked += interval
            if not ended and checked >= _CHECK_S:
                # The crash rules may have closed the run before this session's events
                # began (the session's start): the journal says.
                checked = 0.0
                status = await _status(store, ref)
                if status in ENDED:
                    ended.append(status)
            quiet = quiet + interval if ended and session.idle else 0.0
            if quiet >= _QUIET_S:
                tg.cancel_scope.cancel()
                break
    return ended[0]
