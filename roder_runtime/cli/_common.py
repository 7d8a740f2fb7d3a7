"""Helpers shared by the ``roder`` commands: output, errors, opening a runtime."""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported where used: `roder --help` imports this module alone
    from roder_api.extension import PluginInfo
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


EVENT_LOOP_ENV = "RODER_EVENT_LOOP"
"""The variable that chooses every command's event loop: ``asyncio`` or ``uvloop``."""


def event_loop_options(wanted: str, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Return ``anyio.run``'s ``backend_options`` for a command that asks for the event loop
    ``wanted`` (``roder_api.commands.Command.loop``): uvloop's for ``uvloop`` when uvloop
    is installed, asyncio's otherwise (anyio never uses uvloop on Windows).

    ``RODER_EVENT_LOOP`` (``asyncio`` or ``uvloop``) overrides the command's choice; raise
    :class:`CommandError` (a usage error) for another value, or when it asks for uvloop
    and uvloop is not installed.
    """
    from roder_api.commands import EVENT_LOOPS

    forced = environ.get(EVENT_LOOP_ENV, "").strip().lower()
    if forced and forced not in EVENT_LOOPS:
        choices = " or ".join(EVENT_LOOPS)
        raise CommandError(f"{EVENT_LOOP_ENV} must be {choices}, not {forced!r}", EXIT_USAGE)
    if (forced or wanted) != "uvloop":
        return {}
    if importlib.util.find_spec("uvloop") is not None:
        return {"use_uvloop": True}
    if forced:
        raise CommandError(
            f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed (pip install uvloop)",
            EXIT_USAGE,
        )
    return {}


def lazy_handler(module: str, name: str) -> Callable[[argparse.Namespace], Awaitable[int]]:
    """Return a command handler that imports ``roder_runtime.cli.<module>`` when it runs,
    so that registering a command's arguments does not import what runs it."""

    async def handler(args: argparse.Namespace) -> int:
        run: Callable[[argparse.Namespace], Awaitable[int]]
        run = getattr(importlib.import_module(f"roder_runtime.cli.{module}"), name)
        return await run(args)

    return handler


@asynccontextmanager
async def open_runtime(args: argparse.Namespace) -> AsyncIterator[Runtime]:
    """Yield a runtime from ``--config`` (or ``$RODER_HOME/config.toml``), closed after.

    The configuration is read and the plugins imported in a worker thread.
    """
    from roder_runtime._runtime import Runtime

    async with await Runtime.open(args.config) as runtime:
        warn_unknown_plugins(runtime.registry.plugins)
        yield runtime


def warn_unknown_plugins(infos: Iterable[PluginInfo]) -> None:
    """Warn on stderr about each name in ``RODER_PLUGINS`` that no installed plugin has."""
    from roder_api.extension import NOT_INSTALLED

    for info in infos:
        if info.error is not None and info.error.startswith(NOT_INSTALLED):
            print(f"roder: warning: plugin {info.name!r}: {info.error}", file=sys.stderr)


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    import orjson

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


@contextmanager
def progress_callback(desc: str, *, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """Yield an ``on_progress(done, total)`` callback that draws a progress bar on stderr
    (only on a terminal; ``quiet`` hides it), closed when the block ends."""
    from tqdm import tqdm

    disable = quiet or not sys.stderr.isatty()
    bars: list[Any] = []

    def update(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc=desc, disable=disable, file=sys.stderr))
        bar = bars[0]
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


def count(number: int, noun: str) -> str:
    """Return ``number`` with ``noun`` in the singular or plural (``1 thread``, ``2 threads``)."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def iso_ms(ms: int) -> str:
    """Return an ISO 8601 UTC time (``2026-01-31T12:00:00.000Z``) for epoch milliseconds."""
    moment = _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    description: str | None = None,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """Return a new sub-command parser whose ``--help`` ends with ``examples``."""
    epilog = None
    if examples:
        epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_flags(parser, help=argparse.SUPPRESS)
    return parser


def add_global_flags(parser: argparse.ArgumentParser, *, help: str | None = None) -> None:
    """Add ``--config PATH`` and ``--debug`` (``roder --debug threads show X`` and ``roder
    threads show X --debug`` alike).

    On a sub-command (``help=argparse.SUPPRESS``) an absent flag leaves the value ``roder``
    itself parsed (``default=SUPPRESS``), so a flag before the command is not undone.
    """
    default: Any = argparse.SUPPRESS if help == argparse.SUPPRESS else None
    taken = parser._option_string_actions  # a plugin command may have its own
    if "--config" not in taken:
        parser.add_argument(
            "--config",
            metavar="PATH",
            default=default,
            help=help or "configuration file (default $RODER_HOME/config.toml)",
        )
    if "--debug" not in taken:
        parser.add_argument(
            "--debug",
            action="store_true",
            default=default if default is not None else False,
            help=help or "show tracebacks on errors",
        )


def add_global_flags_below(parser: argparse.ArgumentParser) -> None:
    """Add the global flags (hidden) to ``parser`` and to every sub-command parser under it
    (a plugin command and its own sub-commands), where it does not have them already."""
    add_global_flags(parser, help=argparse.SUPPRESS)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                add_global_flags_below(sub)


_DURATION_UNITS_MS = {
    "s": 1000,
    "m": 60 * 1000,
    "h": 60 * 60 * 1000,
    "d": 24 * 60 * 60 * 1000,
    "w": 7 * 24 * 60 * 60 * 1000,
}
_DURATION = re.compile(r"(?:\d+[smhdw])+", re.ASCII)
_DURATION_PART = re.compile(r"(\d+)([smhdw])", re.ASCII)


def parse_duration(text: str) -> int:
    """Return the milliseconds of a duration such as ``30d``, ``12h``, ``2w`` or ``1d12h``.

    Raise ``argparse.ArgumentTypeError`` (a usage error) for anything else.
    """
    cleaned = text.strip().lower()
    if not _DURATION.fullmatch(cleaned):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit (s, m, h, d, w), e.g. 30d or 12h"
        )
    return sum(int(n) * _DURATION_UNITS_MS[unit] for n, unit in _DURATION_PART.findall(cleaned))


def parse_moment(text: str, *, now_ms: int | None = None) -> int:
    """Return epoch milliseconds for a date, an ISO time, or a duration ago.

    ``2026-01-31`` (midnight UTC), ``2026-01-31T12:00``, ``2026-01-31T12:00:00+02:00`` (a time
    without a zone is UTC) or ``7d`` (seven days before now). Raise
    ``argparse.ArgumentTypeError`` (a usage error) for anything else.
    """
    cleaned = text.strip()
    if _DURATION.fullmatch(cleaned.lower()):
        now = now_ms if now_ms is not None else now_milliseconds()
        return now - parse_duration(cleaned)
    iso = cleaned[:-1] + "+00:00" if cleaned[-1:] in ("Z", "z") else cleaned
    try:
        moment = _dt.datetime.fromisoformat(iso)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use a date (2026-01-31), an ISO time "
            "(2026-01-31T12:00:00, UTC unless it names a zone) or a duration ago (7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return int(moment.timestamp() * 1000)


def now_milliseconds() -> int:
    """Return the current time in milliseconds since the epoch."""
    return int(_dt.datetime.now(_dt.timezone.utc).timestamp() * 1000)


def format_size(size: int) -> str:
    """Return a byte count for people (``512 B``, ``1.5 KiB``, ``3.2 MiB``)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def on_terminal() -> bool:
    """Return True when stdin is a terminal that a person can answer a question on."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # stdin closed or replaced by something odd
        return False


async def confirm(question: str) -> bool:
    """Ask ``question`` on the terminal; return True only for an answer starting with y."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    import anyio.to_thread

    answer = await anyio.to_thread.run_sync(sys.stdin.readline)
    return answer.strip().lower() in ("y", "yes")


async def write_text_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename)."""

    def write() -> None:
        target = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            # mkstemp makes the file private (0600); give it the mode a plain open() would.
            try:
                mode = os.stat(target).st_mode & 0o7777
            except FileNotFoundError:
                umask = os.umask(0o22)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.chmod(tmp, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    try:
        import anyio.to_thread

        await anyio.to_thread.run_sync(write)
    except OSError as exc:
        # Name the path the user gave, not the temporary file beside it.
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError):
            reason = f"no such directory: {Path(path).parent}"
        raise CommandError(f"cannot write {os.fspath(path)}: {reason}") from None
