"""The ``roder`` sub-commands that plugins add (hook ``register_commands``).

:func:`plugin_commands` is the one place the CLI asks the registry for them (so that
plugin loading can be made lazy there); :class:`CliCommandContext` is what a command gets.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from roder_api.commands import Command
from roder_api.extension import ExtensionRegistryBuilder
from roder_runtime._cli._common import warn_unknown_plugins
from roder_runtime._config import RuntimeConfig, load_config
from roder_runtime._runtime import Runtime, load_registry


def plugin_commands(taken: set[str]) -> list[Command]:
    """Return the commands the installed plugins register, skipping names in ``taken``.

    Blocking: it imports the plugins (a plugin that fails to load adds no command; ``roder
    plugins`` says why).
    """
    builder = ExtensionRegistryBuilder()
    builder.load_entry_points()
    commands = builder.build().commands
    return [commands[name] for name in sorted(commands) if name not in taken]


def register(subparsers: Any, taken: set[str]) -> None:
    """Add a sub-command for each plugin command whose name no built-in command has."""
    for command in plugin_commands(taken):
        parser: argparse.ArgumentParser = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help[:1].upper() + command.help[1:] + ".",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.configure(parser)
        parser.set_defaults(handler=functools.partial(_run, command))


async def _run(command: Command, args: argparse.Namespace) -> int:
    config = await anyio.to_thread.run_sync(load_config, args.config)
    return await command.run(args, CliCommandContext(args.config, config))


class CliCommandContext:
    """A :class:`roder_api.commands.CommandContext` from the ``roder`` command line."""

    def __init__(self, config_path: str | None, config: RuntimeConfig) -> None:
        self._config_path = config_path
        self._config = config

    @property
    def config_path(self) -> str | None:
        """Return ``--config`` (None: ``$RODER_HOME/config.toml``)."""
        return self._config_path

    @property
    def plugin_settings(self) -> Mapping[str, Mapping[str, Any]]:
        """Return the settings the plugins get from the configuration."""
        return self._config.plugin_settings()

    def open_runtime(
        self, overrides: Mapping[str, Any] | None = None
    ) -> AbstractAsyncContextManager[Runtime]:
        """Return a context manager that opens the configured runtime (closed on exit).

        ``overrides`` may hold a ``thread_store`` table whose keys replace the file's
        (for example another ``path`` or ``schema``); other keys are refused.
        """
        return self._open(dict(overrides or {}))

    @asynccontextmanager
    async def _open(self, overrides: dict[str, Any]) -> AsyncIterator[Runtime]:
        store = overrides.pop("thread_store", None)
        if overrides:
            raise ValueError(f"cannot override {', '.join(sorted(overrides))}")
        config = await anyio.to_thread.run_sync(load_config, self._config_path)
        if store:
            config.thread_store_settings.update(store)
        registry = await anyio.to_thread.run_sync(load_registry, config)
        async with Runtime(registry, config, owns_registry=True) as runtime:
            warn_unknown_plugins(runtime.registry.plugins)
            yield runtime
