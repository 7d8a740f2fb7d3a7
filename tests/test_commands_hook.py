"""The ``register_commands`` hook: plugins add ``roder`` sub-commands."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder, hookimpl
from roder_api.commands import Command, CommandContext
from roder_api.errors import DuplicateRegistrationError
from roder_runtime import cli
from roder_runtime.cli import build_parser
from roder_runtime.cli._common import CommandError, event_loop_options


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


def test_a_command_chooses_its_event_loop_and_the_variable_overrides_it() -> None:
    assert Command("hello", "say hello", _configure, _run).loop == "asyncio"
    with pytest.raises(ValueError, match="trio"):
        Command("hello", "say hello", _configure, _run, loop="trio")  # type: ignore[arg-type]
    assert event_loop_options("asyncio", {}) == {}
    assert event_loop_options("uvloop", {}) == {"use_uvloop": True}  # installed with the server
    assert event_loop_options("uvloop", {"RODER_EVENT_LOOP": "asyncio"}) == {}
    assert event_loop_options("asyncio", {"RODER_EVENT_LOOP": " UVLOOP "}) == {"use_uvloop": True}
    with pytest.raises(CommandError, match="asyncio or uvloop, not 'uvlop'") as bad:
        event_loop_options("asyncio", {"RODER_EVENT_LOOP": "uvlop"})
    assert bad.value.exit_code == 2


def test_roder_runs_a_command_on_the_loop_it_asks_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser(["serve"]).parse_args(["serve"]).roder_event_loop == "uvloop"
    seen: list[str] = []

    async def handler(args: argparse.Namespace) -> int:
        seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])
        return 7

    def parser_of(loop: str) -> Callable[[object], argparse.ArgumentParser]:
        def build(argv: object) -> argparse.ArgumentParser:
            parser = argparse.ArgumentParser()
            parser.set_defaults(handler=handler, roder_event_loop=loop, debug=False)
            return parser

        return build

    monkeypatch.delenv("RODER_EVENT_LOOP", raising=False)
    for loop in ("uvloop", "asyncio"):
        monkeypatch.setattr(cli, "build_parser", parser_of(loop))
        assert cli.main([]) == 7
    assert seen == ["uvloop", "asyncio"]  # uvloop.Loop, then asyncio's own loop class
    for forced, asked in (("asyncio", "uvloop"), ("uvloop", "asyncio")):  # the variable wins
        monkeypatch.setenv("RODER_EVENT_LOOP", forced)
        monkeypatch.setattr(cli, "build_parser", parser_of(asked))
        assert cli.main([]) == 7
    assert seen == ["uvloop", "asyncio", "asyncio", "uvloop"]
    monkeypatch.setenv("RODER_EVENT_LOOP", "uvlop")
    assert cli.main([]) == 2 and len(seen) == 4
    assert "RODER_EVENT_LOOP must be asyncio or uvloop" in capsys.readouterr().err


def test_without_uvloop_a_command_that_asks_runs_on_asyncio_and_the_variable_is_refused(
    tmp_path: Path,
) -> None:
    """In a real process where uvloop cannot be imported: ``roder serve``'s choice falls
    back to asyncio's loop, and ``RODER_EVENT_LOOP=uvloop roder threads list`` is a usage
    error that says why (nothing runs)."""
    script = (
        "import sys\n"
        "sys.modules['uvloop'] = None  # not importable: find_spec says it is not there\n"
        "from roder_runtime.cli import main\n"
        "from roder_runtime.cli._common import event_loop_options\n"
        "assert event_loop_options('uvloop', {}) == {}\n"
        "sys.exit(main(['threads', 'list']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env.update({"RODER_HOME": str(tmp_path), "RODER_EVENT_LOOP": "uvloop"})
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "RODER_EVENT_LOOP=uvloop, but uvloop is not installed" in done.stderr
    env["RODER_EVENT_LOOP"] = "asyncio"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_installed_roder_refuses_a_bad_event_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env.update({"RODER_HOME": str(tmp_path), "RODER_EVENT_LOOP": "tokio"})
    roder = Path(sys.executable).parent / "roder"
    done = subprocess.run(
        [str(roder), "threads", "list"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2
    assert "roder: error: RODER_EVENT_LOOP must be asyncio or uvloop, not 'tokio'" in done.stderr
