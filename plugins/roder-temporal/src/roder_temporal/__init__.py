"""Roder's runs across a fleet on Temporal (docs/serve.md, "Runs on Temporal").

``roder serve --dispatch temporal`` hands each accepted run to a Temporal workflow
(:class:`TemporalDispatcher`); ``roder temporal worker`` answers them without HTTP. The
journal stays the source of truth: Temporal only schedules who answers a run.
"""

from __future__ import annotations

from roder_temporal._activity import RunAnswerer
from roder_temporal._dispatch import (
    FACTORY,
    TemporalDispatcher,
    TemporalDispatcherFactory,
    running_worker,
)
from roder_temporal._settings import TemporalSettings
from roder_temporal._workflow import RunRef, RunWorkflow, workflow_id

__all__ = [
    "FACTORY",
    "RunAnswerer",
    "RunRef",
    "RunWorkflow",
    "TemporalDispatcher",
    "TemporalDispatcherFactory",
    "TemporalSettings",
    "running_worker",
    "workflow_id",
]
