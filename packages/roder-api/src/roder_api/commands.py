"""Commands a plugin adds to the ``roder`` command line (hook ``register_commands``).

A plugin registers a :class:`Command`; the ``roder`` CLI adds a sub-command for it, lets
``configure`` add its arguments, and on use awaits ``run(args, context)`` with a
:class:`CommandContext`: what the CLI knows (the configuration file, the plugins'
settings) and how to open the configured runtime. The command returns its exit code.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from roder_api.errors import PluginSettingsError


class CommandContext(Protocol):
    """What the ``roder`` command hands a plugin command when it runs.

    ``config_path`` is ``--config`` (None: ``$RODER_HOME/config.toml``, when it exists);
    ``plugin_settings`` the mapping the hooks get (engine and store ids to their tables,
    plus raw tables such as ``server`` and ``mcp_servers``); ``open_runtime()`` an async
    context manager that opens the configured ``roder_runtime.Runtime`` and closes it on
    exit (typed ``Any`` here: ``roder_api`` does not depend on the runtime; type what you
    use with a Protocol of your own). ``overrides`` (a mapping in ``config.toml``'s shape,
    for example ``{"thread_store": {"path": ...}}``) is laid over the file's tables.
    """

    @property
    def config_path(self) -> str | None:
        """Return the configuration file given with ``--config``, or None."""
        ...

    @property
    def plugin_settings(self) -> Mapping[str, Mapping[str, Any]]:
        """Return the plugins' settings from the configuration."""
        ...

    def open_runtime(
        self, overrides: Mapping[str, Any] | None = None
    ) -> AbstractAsyncContextManager[Any]:
        """Return an async context manager that opens the configured runtime."""
        ...


EventLoop = Literal["asyncio", "uvloop"]
"""The event loops a :class:`Command` may ask for (its ``loop``)."""

EVENT_LOOPS: tuple[str, ...] = get_args(EventLoop)
"""The same names, as a tuple: ``("asyncio", "uvloop")``."""


@dataclass(frozen=True, slots=True)
class Command:
    """A ``roder`` sub-command: its ``name``, one-line ``help``, ``configure`` (adds its
    arguments to the sub-command's parser) and ``run`` (awaited with the parsed arguments
    and a :class:`CommandContext`; returns the exit code).

    ``loop`` is the event loop it runs on: ``asyncio`` (the default), or ``uvloop`` for a
    server (uvloop's loop when it is installed, asyncio's otherwise; the variable
    ``RODER_EVENT_LOOP`` = ``asyncio`` or ``uvloop`` overrides it for every command)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, CommandContext], Awaitable[int]]
    loop: EventLoop = "asyncio"

    def __post_init__(self) -> None:
        if self.loop not in EVENT_LOOPS:
            raise ValueError(f"Command.loop must be {' or '.join(EVENT_LOOPS)}, not {self.loop!r}")


def report_table(
    settings_id: str,
    read: Callable[[Mapping[str, Any] | None], object],
    settings: Mapping[str, Mapping[str, Any]],
    misconfigured: Callable[[str, BaseException | str], None],
) -> None:
    """Check a plugin's own top-level table in ``register_commands``: call ``read`` on
    ``settings[settings_id]`` and report the ``PluginSettingsError`` it raises to
    ``misconfigured`` (``roder config check`` then names the key with its file and line;
    the command still registers and says the same when it runs)."""
    try:
        read(settings.get(settings_id))
    except PluginSettingsError as exc:
        named = f"[{settings_id}] {exc.setting}: {exc.reason}"  # the key, beside its line
        misconfigured(
            f"{settings_id}.{exc.setting}", PluginSettingsError(settings_id, exc.setting, named)
        )


__all__ = ["Command", "CommandContext", "EVENT_LOOPS", "EventLoop", "report_table"]
