"""The workflow: one per accepted run, one activity that answers it.

Temporal only schedules. The activity (``roder.answer_run``, :mod:`roder_temporal._activity`)
opens a normal session on the thread, which answers the thread's accepted input; the
journal stays the source of truth. When a worker dies, the activity's heartbeat stops and
Temporal retries it on another worker after ``heartbeat_timeout_s``; the new session's
crash rules decide what the half-done turn means, never Temporal's retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

WORKFLOW = "roder.run"
"""The workflow type name."""
ACTIVITY = "roder.answer_run"
"""The activity type name."""

_RUN_LIMIT = timedelta(days=7)
"""The longest one attempt may run (a turn may wait days for an approval); a worker that
dies is noticed by its heartbeat long before."""


@dataclass(frozen=True, slots=True)
class RunRef:
    """What a run's workflow carries: the tenant (``""``: default), thread and turn, and
    the heartbeat timeout it was scheduled with."""

    tenant: str
    thread_id: str
    turn_id: str
    heartbeat_timeout_s: float


def workflow_id(tenant: str, thread_id: str, turn_id: str) -> str:
    """Return the workflow id of a run: a second start of one run is the same workflow."""
    return f"roder-run:{tenant}:{thread_id}:{turn_id}"


@workflow.defn(name=WORKFLOW)
class RunWorkflow:
    """Answer one accepted run: run the activity until it reports the run's end."""

    @workflow.run
    async def run(self, ref: RunRef) -> str:
        """Return the run's final status (``completed`` or ``aborted``)."""
        status: str = await workflow.execute_activity(
            ACTIVITY,
            ref,
            start_to_close_timeout=_RUN_LIMIT,
            heartbeat_timeout=timedelta(seconds=ref.heartbeat_timeout_s),
            # Busy (another session holds the thread) and a dead worker are retried, with
            # no limit on attempts; a missing thread or tenant is not.
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=500),
                backoff_coefficient=1.5,
                maximum_interval=timedelta(seconds=5),
                non_retryable_error_types=["ThreadNotFoundError", "UnknownTenant"],
            ),
        )
        return status
