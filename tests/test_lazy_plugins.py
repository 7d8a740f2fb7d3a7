"""Lazy plugins (issue 22 item 2): a plugin that declares what it registers is imported only
when one of its ids is needed; one that declares nothing is imported as before."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from roder_api.errors import DuplicateRegistrationError, PluginLoadError
from roder_api.extension import ExtensionRegistryBuilder

EP = importlib.metadata.EntryPoint
RODER = Path(sys.executable).with_name("roder")

# The bundled plugins' packages (entry point name -> the package its modules are in).
PACKAGES = {
    "anthropic": "roder_anthropic",
    "jsonl": "roder_jsonl_thread_store",
    "llm": "roder_llm",
    "mcp": "roder_mcp",
    "openai": "roder_openai",
    "otel": "roder_otel",
    "postgres": "roder_postgres_thread_store",
    "scripted": "roder_runtime.default_plugins.scripted",
    "server": "roder_server",
    "sqlite": "roder_sqlite_thread_store",
}

SITECUSTOMIZE = """\
import atexit, os, sys

def _dump():
    with open(os.environ["RODER_TEST_MODULES_OUT"], "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

atexit.register(_dump)
"""


def roder(tmp_path: Path, *args: str, config: str = "") -> tuple[str, set[str]]:
    """Run the installed ``roder``; return its stdout and the plugins whose modules it imported."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(config)
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RODER_", "OTEL_"))}
    env.update(RODER_HOME=str(home), PYTHONPATH=str(hook), RODER_TEST_MODULES_OUT=str(out))
    done = subprocess.run(
        [str(RODER), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    modules = out.read_text().split()
    imported = {
        name
        for name, package in PACKAGES.items()
        if any(m == package or m.startswith(package + ".") for m in modules)
    }
    return done.stdout, imported


def test_each_command_imports_only_the_plugins_it_needs(tmp_path: Path) -> None:
    shown, imported = roder(tmp_path, "--help")
    assert imported == set()
    assert "serve" in shown  # a plugin's command is listed without importing its plugin
    _, imported = roder(tmp_path, "prompt", "hi")
    # A turn needs the store, the engine, the tools (mcp) and the observers (otel).
    assert imported <= {"jsonl", "scripted", "mcp", "otel"} and {"jsonl", "scripted"} <= imported
    listed, imported = roder(tmp_path, "threads", "list")
    assert "'hi'" in listed
    assert imported == {"jsonl"}
    _, imported = roder(tmp_path, "plugins")  # shows what each registered: imports all
    assert {"openai", "server", "jsonl", "mcp"} <= imported


def test_mcp_servers_start_for_a_turn_and_not_to_list_threads(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    server = tmp_path / "server.py"
    server.write_text(f"open({str(marker)!r}, 'a').write('started\\n')\n")
    config = textwrap.dedent(
        f"""\
        [mcp_servers.probe]
        command = {sys.executable!r}
        args = [{str(server)!r}]
        """
    )
    roder(tmp_path, "threads", "list", config=config)
    assert not marker.exists()  # its plugin checked the table (check_only), started nothing
    roder(tmp_path, "--help", config=config)
    assert not marker.exists()
    roder(tmp_path, "prompt", "hi", config=config)
    assert marker.exists()  # the turn needed the tools: the server was started


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Plugin modules on a path of their own: each registers an engine named as it says."""
    for name, body in {
        "lazy_eager_plugin": "ENGINE = 'plain'",
        "lazy_declared_plugin": "ENGINE = 'declared'",
        "lazy_second_plugin": "ENGINE = 'declared'",
        "lazy_broken_plugin": "raise ImportError('needs a library that is not installed')",
    }.items():
        (tmp_path / f"{name}.py").write_text(
            body
            + textwrap.dedent(
                """
                from roder_api import hookimpl
                from roder_api.testing import ScriptedEngine

                @hookimpl
                def register_inference_engines(register):
                    register(ScriptedEngine(id=ENGINE))
                """
            )
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(sys.modules):
        if name.startswith("lazy_"):
            del sys.modules[name]
    return tmp_path


def test_a_declared_plugin_is_imported_when_its_id_is_asked_for(modules: Path) -> None:
    builder = ExtensionRegistryBuilder()
    infos = builder.load_entry_points(
        names=None,
        entry_points=[
            EP("eager", "lazy_eager_plugin", "roder"),
            EP("lazy", "lazy_declared_plugin", "roder"),
            EP("declared", "lazy_declared_plugin", "roder.engines"),
        ],
    )
    # Without declarations a plugin is imported at once, as plugins written for the
    # API before lazy loading expect.
    assert [(i.name, i.imported) for i in infos] == [("eager", True), ("lazy", False)]
    assert "lazy_eager_plugin" in sys.modules and "lazy_declared_plugin" not in sys.modules
    registry = builder.build()
    assert sorted(registry.engines) == ["declared", "plain"]
    assert "lazy_declared_plugin" not in sys.modules
    assert registry.inference_engine("declared").id == "declared"
    assert "lazy_declared_plugin" in sys.modules
    info = next(i for i in registry.plugins if i.name == "lazy")
    assert info.imported and info.engines == ("declared",) and info.error is None


def test_a_declared_plugin_that_fails_to_import_is_reported_by_name(modules: Path) -> None:
    builder = ExtensionRegistryBuilder()
    builder.load_entry_points(
        entry_points=[
            EP("broken", "lazy_broken_plugin", "roder"),
            EP("gone", "lazy_broken_plugin", "roder.engines"),
        ]
    )
    registry = builder.build()
    with pytest.raises(PluginLoadError) as info:
        registry.inference_engine("gone")
    assert info.value.plugin == "broken" and "needs a library" in str(info.value)
    assert "gone" not in registry.engines
    [shown] = registry.load_all()
    assert shown.name == "broken" and "ImportError: needs a library" in (shown.error or "")


def test_an_id_two_plugins_declare_is_an_error_naming_both(modules: Path) -> None:
    builder = ExtensionRegistryBuilder()
    infos = builder.load_entry_points(
        entry_points=[
            EP("a-first", "lazy_declared_plugin", "roder"),
            EP("b-second", "lazy_second_plugin", "roder"),
            EP("declared", "lazy_declared_plugin", "roder.engines"),
            EP("declared", "lazy_second_plugin", "roder.engines"),
        ]
    )
    error = infos[1].error or ""
    assert DuplicateRegistrationError.__name__ in error
    assert "plugin 'a-first'" in error and "plugin 'b-second'" in error
    assert "lazy_second_plugin" not in sys.modules
    registry = builder.build()
    assert registry.inference_engine("declared").id == "declared"
    assert "lazy_second_plugin" not in sys.modules


# Every module a command imports (sys.modules at exit, the interpreter's own included),
# bounded a little above what the command imports now (Python 3.11: --help 182, threads
# list 340, prompt 451; before the runtime's imports were made lazy 311, 402, 490, and
# before JSONL's fsck, filelock and the kit's SQL pieces were imported on first use
# 182, 373, 479): a new eager import shows up here.
MODULE_BOUNDS = {("--help",): 200, ("threads", "list"): 360, ("prompt", "hi"): 470}


def test_each_command_imports_a_bounded_number_of_modules(tmp_path: Path) -> None:
    counts = {}
    for args in MODULE_BOUNDS:
        roder(tmp_path, *args)
        modules = set((tmp_path / "modules.txt").read_text().split())
        counts[args] = len(modules)
        assert "roder_runtime.cli" in modules  # the walk saw the command's modules
        if args == ("--help",):
            # The argparse tree alone: no command's implementation, no runtime, no contract.
            ours = {m for m in modules if m.startswith("roder_runtime.")}
            assert ours <= {"roder_runtime.cli", "roder_runtime.cli._common"} | {
                "roder_runtime.cli._plugin_commands"
            }
            assert "roder_api.events" not in modules and "roder_api.codec" not in modules
        if args == ("threads", "list"):
            # Listing threads opens no session, runs no turn and compacts nothing.
            assert (
                not {
                    "roder_runtime.session._session",
                    "roder_runtime.turn._driver",
                    "roder_runtime.compaction._compaction",
                    "roder_runtime.threads._migration",
                    "roder_runtime.cli._chat",
                    # nor checks journals (fsck), runs a model call, or locks on Windows
                    "roder_jsonl_thread_store._fsck",
                    "roder_runtime.model._call",
                    "filelock",
                    "roder_api.storekit._relational",  # the SQL stores' base
                }
                & modules
            )
    assert all(counts[args] <= bound for args, bound in MODULE_BOUNDS.items()), counts


def _listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    """Return each sub-command of ``parser`` with its one-line help, in help order."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [(action.dest, action.help) for action in sub._choices_actions]


def test_the_cli_lists_its_commands_as_their_modules_register_them() -> None:
    # `roder --help` lists the built-in commands from cli.COMMANDS without importing their
    # modules: the names, order and help must be what the modules themselves register.
    from roder_runtime import cli

    builtin = {name for _, commands in cli.COMMANDS for name, _ in commands}
    lazy = [row for row in _listed(cli.build_parser(["--help"])) if row[0] in builtin]
    eager = [row for row in _listed(cli.build_parser()) if row[0] in builtin]
    assert len(eager) == len(builtin) == 10
    assert lazy == eager
    chosen = cli.build_parser(["threads", "list"])
    assert chosen.parse_args(["threads", "list", "--json"]).json is True
