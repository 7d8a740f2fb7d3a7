"""The ``roder`` command.

Exit codes: 0 success, 1 failure (a clear one-line error on stderr; ``--debug`` adds the
traceback), 2 usage error, 130 interrupted. Each command group lives in its own module with
a ``register(subparsers)`` function that adds its parser and sets ``handler``.

May import: roder_runtime, _runtime, threads, session, turn, compaction, tools, model, config.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import anyio

if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
    from exceptiongroup import BaseExceptionGroup

from roder_api.errors import RoderError
from roder_runtime import __version__
from roder_runtime.cli import (
    _chat,
    _compact,
    _config_cmd,
    _fsck,
    _migrate,
    _models,
    _plugin_commands,
    _plugins,
    _replay,
    _threads,
)
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_global_flags,
)

COMMAND_MODULES = (
    _chat,
    _threads,
    _replay,
    _compact,
    _migrate,
    _fsck,
    _models,
    _plugins,
    _config_cmd,
)
"""The modules whose ``register`` adds a command (in ``roder --help`` order)."""


EPILOG = """\
examples:
  roder chat                                  chat on a new durable thread
  roder chat --thread ID                      continue a thread (a unique id prefix will do)
  roder chat -c                               continue the latest thread
  roder prompt "text"                         one prompt, the reply on stdout
  roder models                                the models of every engine
  roder threads list --updated-after 7d       find recent threads
  roder threads show ID                       read a transcript
  roder replay ID                             what the next model call receives
  roder threads prune --older-than 30d --dry-run
  roder config show                           settings and where they came from
  roder COMMAND --help                        each command's options and examples

--config and --debug may be given before or after the command
(roder threads show ID --debug).

exit codes:
  0    ok
  1    failure (a one-line error on stderr; --debug adds the traceback)
  2    usage error (bad arguments, or a question that cannot be asked without a terminal)
  130  interrupted
"""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the ``roder`` argument parser with every command.

    With ``argv``, only the plugin command it chooses (if any) is imported to add its
    arguments; the other plugin commands are listed by name and help alone, so that
    ``roder --help`` and the built-in commands import no plugin for them.
    """
    parser = argparse.ArgumentParser(
        prog="roder",
        description="Roder: a small, durable agent runtime.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"roder {__version__}")
    add_global_flags(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    chosen = "*" if argv is None else _chosen_command(argv)
    _plugin_commands.register(subparsers, set(subparsers.choices), chosen)
    return parser


def _chosen_command(argv: Sequence[str]) -> str | None:
    """Return the command ``argv`` names (its first word that is not a global flag)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``roder`` command; return its exit code."""
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = anyio.run(handler, args)
        return code
    except KeyboardInterrupt:
        print("roder: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CommandError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"roder: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except RoderError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"roder: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        return _reader_left()
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
        if _only_broken_pipes(exc):
            return _reader_left()
        if args.debug:
            traceback.print_exc()
        print(f"roder: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def _only_broken_pipes(exc: BaseException) -> bool:
    """Return True for a ``BrokenPipeError``, or a group (from a task group) of only those."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_broken_pipes(inner) for inner in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _reader_left() -> int:
    """Exit 0 when the reader of stdout went away (``roder threads show ID | head -1``).

    Standard output is pointed at /dev/null so that the interpreter's last flush at exit
    does not fail on the closed pipe again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_OK


def _describe(exc: BaseException) -> str:
    """Return a one-line account of an unexpected error, pointing to ``--debug``."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc} (run with --debug for the traceback)"


def run() -> None:
    """Console-script entry point."""
    code = main()
    try:
        sys.stdout.flush()  # what is still buffered, while a broken pipe can be handled
    except BrokenPipeError:
        code = _reader_left()
    sys.exit(code)
