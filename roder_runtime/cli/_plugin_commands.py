"""The ``roder`` sub-commands that plugins add (hook ``register_commands``).

:func:`plugin_commands` is the one place the CLI asks the registry for them (so that
plugin loading can be made lazy there); :class:`CliCommandContext` is what a command gets.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roder_api.errors import PluginLoadError
from roder_api.extension import ExtensionRegistryBuilder, PluginInfo
from roder_runtime.cli._common import add_global_flags_below, warn_unknown_plugins

if TYPE_CHECKING:  # imported when a command runs: `roder --help` lists commands alone
    from roder_api.commands import Command
    from roder_runtime._runtime import Runtime
    from roder_runtime.config._config import RuntimeConfig


def plugin_commands(taken: set[str], chosen: str | None = None) -> list[Command | LazyCommand]:
    """Return the commands the installed plugins register, skipping names in ``taken``.

    A command of a lazy plugin (one that declares its commands) is a :class:`LazyCommand`
    (name and one-line help, its plugin not imported) unless it is ``chosen``: ``roder
    --help`` lists ``roder serve`` without importing the server. ``chosen`` "*": every
    command imported (the CLI reference). Blocking: it may import plugins (one that fails
    to load adds no command; ``roder plugins`` says why, and so does running its command).
    """
    builder = ExtensionRegistryBuilder()
    builder.load_entry_points()
    registry = builder.build()
    lazy = {name: info for info in registry.plugins if not info.imported for name in info.commands}
    found: list[Command | LazyCommand] = []
    for name in sorted(registry.commands):
        if name in taken:
            continue
        info = lazy.get(name)
        if info is not None and chosen not in (name, "*"):
            found.append(LazyCommand(name, _lazy_help(name, info)))
            continue
        try:
            found.append(registry.command(name))
        except PluginLoadError as exc:
            if chosen == name:
                found.append(LazyCommand(name, f"(plugin {exc.plugin!r} failed to load)", exc))
        except KeyError:
            continue
    return found


@dataclass(frozen=True)
class LazyCommand:
    """A plugin command listed by name and help, its plugin not imported (or failed)."""

    name: str
    help: str
    failure: PluginLoadError | None = None


def _lazy_help(name: str, info: PluginInfo) -> str:
    """Return a lazy command's help: its distribution's summary less a ``roder NAME:`` lead."""
    summary = (info.summary or f"a command of plugin {info.name!r}").strip().rstrip(".")
    lead = f"roder {name}:"
    if summary.startswith(lead):
        summary = summary[len(lead) :].strip()
    return summary[:1].lower() + summary[1:]


def register(subparsers: Any, taken: set[str], chosen: str | None = "*") -> None:
    """Add a sub-command for each plugin command whose name no built-in command has.

    Only the ``chosen`` command (``*``: all) is imported and gets its arguments; the
    others are listed with their help (see :func:`plugin_commands`).
    """
    for command in plugin_commands(taken, chosen):
        parser: argparse.ArgumentParser = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help[:1].upper() + command.help[1:] + ".",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if isinstance(command, LazyCommand):
            # Not chosen (never run: argv chose another command) or its plugin failed.
            add_global_flags_below(parser)
            parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            parser.set_defaults(handler=functools.partial(_unavailable, command))
            continue
        command.configure(parser)
        add_global_flags_below(parser)  # `roder serve --debug`, as `roder threads list --debug`
        parser.set_defaults(handler=functools.partial(_run, command), roder_event_loop=command.loop)


async def _unavailable(command: LazyCommand, args: argparse.Namespace) -> int:
    if command.failure is not None:
        raise command.failure
    raise RuntimeError(f"roder {command.name} was not prepared (its plugin was not imported)")


async def _run(command: Command, args: argparse.Namespace) -> int:
    import anyio.to_thread

    from roder_runtime.config._config import load_config

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
        import anyio.to_thread

        from roder_runtime._runtime import Runtime, load_registry
        from roder_runtime.config._config import load_config

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
