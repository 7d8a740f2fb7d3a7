"""The plugin's hooks: ``roder serve`` and the check of the ``[server]`` table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.commands import Command, report_table
from roder_server._command import SERVE
from roder_server._settings import SETTINGS_ID, ServerSettings


@hookimpl
def register_commands(
    register: Callable[[Command], None],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Register ``roder serve``; report a wrong ``[server]`` table (``roder config check``
    names it with its file and line; ``roder serve`` refuses it when it runs)."""
    register(SERVE)
    report_table(SETTINGS_ID, ServerSettings.from_table, settings, misconfigured)
