"""The plugin's hooks: ``roder temporal`` and the check of the ``[temporal]`` table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.commands import Command, report_table
from roder_temporal._command import TEMPORAL
from roder_temporal._settings import SETTINGS_ID, TemporalSettings


@hookimpl
def register_commands(
    register: Callable[[Command], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register ``roder temporal``; report a wrong ``[temporal]`` table (the command still
    registers, and says what is wrong when it runs)."""
    register(TEMPORAL)
    report_table(SETTINGS_ID, TemporalSettings.from_table, settings, misconfigured)
