"""The ``register_commands`` hook: plugins add ``roder`` sub-commands."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest

from roder_api import ExtensionRegistryBuilder, hookimpl
from roder_api.commands import Command, CommandContext
from roder_api.errors import DuplicateRegistrationError
from roder_runtime.cli import build_parser


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=1)


async def _run(args: argparse.Namespace, context: CommandContext) -> int:
    return int(args.n)


def test_a_plugin_registers_a_command_and_duplicates_are_refused() -> None:
    plugin = types.SimpleNamespace()

    @hookimpl
    def register_commands(register: object) -> None:
        register(Command("hello", "say hello", _configure, _run))  # type: ignore[operator]

    plugin.register_commands = register_commands
    builder = ExtensionRegistryBuilder()
    info = builder.load_plugin("hello-plugin", plugin)
    assert info.error is None
    assert list(builder.build().commands) == ["hello"]
    with pytest.raises(DuplicateRegistrationError, match="hello"):
        builder.command(Command("hello", "again", _configure, _run))
    second = builder.load_plugin("other", plugin)
    assert second.error is not None and "hello" in second.error


def test_the_cli_adds_the_installed_plugin_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--port", "0"])
    assert args.port == 0 and callable(args.handler)
    done = subprocess.run(
        [sys.executable, "-m", "roder_runtime", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "serve" in done.stdout
