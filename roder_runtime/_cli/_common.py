"""Helpers shared by the ``roder`` commands: output, errors, opening a runtime."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from roder_runtime._runtime import Runtime

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """Raised by a command to fail with a one-line message and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def open_runtime(args: argparse.Namespace) -> Runtime:
    """Return a runtime from ``--config`` (or ``$RODER_HOME/config.toml``)."""
    return Runtime.from_config(args.config)


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` (machine-readable output) to a command."""
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def format_ms(ms: int) -> str:
    """Return a UTC timestamp for milliseconds since the epoch."""
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
