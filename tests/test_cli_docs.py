"""The CLI reference cannot drift from the parser, and every command's help has examples."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from roder_runtime.cli import build_parser
from roder_runtime.cli._docs import render

from .conftest import REPO


def commands(
    parser: argparse.ArgumentParser, path: str = "roder"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_cli_reference_is_generated_from_the_parser() -> None:
    doc = (REPO / "docs" / "cli.md").read_text()
    assert doc == render(build_parser()), "docs/cli.md is stale: run scripts/gen-cli-docs"
    for path, _ in commands(build_parser()):
        if path != "roder":
            assert f"## `{path}`" in doc, f"{path} is not in docs/cli.md"
    assert "130  interrupted" in doc and "2    usage error" in doc


def test_gen_cli_docs_script_writes_and_checks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    script = str(REPO / "scripts" / "gen-cli-docs")
    ok = subprocess.run([script, "--check"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    target = tmp_path / "cli.md"
    target.write_text("stale\n")
    stale = subprocess.run(
        [script, "--check", "--output", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stale.returncode == 1 and "out of date" in stale.stderr
    wrote = subprocess.run(
        [script, "--output", str(target)], env=env, capture_output=True, text=True, timeout=60
    )
    assert wrote.returncode == 0 and target.read_text() == render(build_parser())


@pytest.mark.parametrize("path", [p for p, _ in commands(build_parser())])
def test_every_command_has_help_with_examples(path: str) -> None:
    parser = dict(commands(build_parser()))[path]
    text = parser.format_help()
    assert "examples:" in text, f"`{path} --help` shows no examples"
    assert parser.description, f"`{path}` has no description"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue  # its commands carry the help
        assert action.help, f"`{path}`: {action.dest} has no help text"


def test_root_help_documents_exit_codes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "roder_runtime", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    codes = result.stdout.split("exit codes:", 1)[1]
    for code in ("0    ok", "1    failure", "2    usage error", "130  interrupted"):
        assert code in codes


def doc_commands() -> Iterator[tuple[str, str]]:
    """Yield ``(file, command)`` for each ``roder ...`` line in the docs' shell blocks."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for file in files:
        if file.name == "cli.md":
            continue  # generated from the parser itself
        for block in re.findall(r"```(?:bash|console|sh)\n(.*?)```", file.read_text(), re.S):
            for line in block.splitlines():
                line = line.removeprefix("$ ").strip()
                for part in re.split(r"\s*(?:\||&&|;|>)\s*", line):
                    part = part.split(" #", 1)[0].strip()
                    if part.startswith("roder ") and "$(" not in part:
                        yield file.name, part


def test_every_roder_command_in_the_docs_parses() -> None:
    found = list(doc_commands())
    assert any(name == "getting-started.md" for name, _ in found)
    parser = build_parser()
    for name, command in found:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:  # argparse exits on a bad command line
            if exc.code != 0:
                pytest.fail(f"{name}: `{command}` does not parse")
