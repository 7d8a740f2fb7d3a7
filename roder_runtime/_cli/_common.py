"""Helpers shared by the ``roder`` commands: output, errors, opening a runtime."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import orjson

from roder_runtime._runtime import Runtime

T = TypeVar("T")

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


def progress(
    iterable: Iterable[T], *, total: int | None = None, desc: str = "", quiet: bool = False
) -> Iterator[T]:
    """Return ``iterable`` wrapped in a progress bar on stderr (shown only on a terminal).

    ``quiet`` (for example with ``--json``) hides it.
    """
    from tqdm import tqdm

    disable = quiet or not sys.stderr.isatty()
    return iter(tqdm(iterable, total=total, desc=desc, disable=disable, file=sys.stderr))


def format_ms(ms: int) -> str:
    """Return a UTC timestamp for milliseconds since the epoch."""
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
