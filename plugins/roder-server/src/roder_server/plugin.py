"""The plugin's hooks: ``roder serve``."""

from __future__ import annotations

from collections.abc import Callable

from roder_api import hookimpl
from roder_api.commands import Command
from roder_server._command import SERVE


@hookimpl
def register_commands(register: Callable[[Command], None]) -> None:
    """Register ``roder serve``."""
    register(SERVE)
