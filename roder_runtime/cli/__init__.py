"""The ``roder`` command.

Exit codes: 0 success, 1 failure (a clear one-line error on stderr; ``--debug`` adds the
traceback), 2 usage error, 130 interrupted. Each command group lives in its own module with
a ``register(subparsers)`` function that adds its parser and sets ``handler``.

May import: roder_runtime, _runtime, threads, session, turn, compaction, tools, model, config.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
    from exceptiongroup import BaseExceptionGroup

from roder_api.errors import RoderError
from roder_runtime import __version__
from roder_runtime.cli import _plugin_commands
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_global_flags,
    event_loop_options,
)

COMMANDS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "_chat",
        (("chat", "chat on a durable thread"), ("prompt", "send one prompt and print the reply")),
    ),
    ("_threads", (("threads", "list, inspect, export, fork, delete and prune threads"),)),
    ("_replay", (("replay", "show what the next model call on a thread would receive"),)),
    ("_compact", (("compact", "compact a thread's history now"),)),
    ("_migrate", (("migrate", "copy every thread from one store to another, verified"),)),
    ("_fsck", (("fsck", "check the thread journals (and repair them)"),)),
    ("_models", (("models", "list the models of every engine (or one)"),)),
    ("_plugins", (("plugins", "list installed plugins"),)),
    ("_config_cmd", (("config", "show or check the configuration"),)),
)
"""The modules of ``roder_runtime.cli`` whose ``register`` adds commands (in ``roder --help``
order), with the commands each adds and their one-line help. A module is imported only when
one of its commands runs (every one for the CLI reference): ``roder --help`` and ``roder
threads list`` do not import the chat, the compaction or the migration."""


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

    With ``argv``, only the command it chooses (if any) is imported to add its arguments;
    the other commands, built-in (:data:`COMMANDS`) and of plugins, are listed by name and
    help alone, so that ``roder --help`` imports no command and no plugin.
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
    chosen = "*" if argv is None else _chosen_command(argv)
    for module, commands in COMMANDS:
        if chosen == "*" or any(name == chosen for name, _ in commands):
            importlib.import_module(f"{__name__}.{module}").register(subparsers)
            continue
        for name, summary in commands:  # listed, not chosen: never run
            placeholder = subparsers.add_parser(name, help=summary)
            placeholder.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            placeholder.set_defaults(handler=_not_chosen)
    if chosen not in subparsers.choices:  # a built-in command runs: no plugin's is needed
        _plugin_commands.register(subparsers, set(subparsers.choices), chosen)
    return parser


async def _not_chosen(args: argparse.Namespace) -> int:
    raise RuntimeError(f"roder {args.command} was not prepared (its module was not imported)")


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
    import anyio

    try:
        # A plugin command may ask for uvloop (roder serve does): Command.loop.
        options = event_loop_options(getattr(args, "roder_event_loop", "asyncio"))
        code: int = anyio.run(handler, args, backend_options=options)
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
