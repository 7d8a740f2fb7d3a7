"""``roder temporal worker``: answer runs scheduled on Temporal, without HTTP."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

import anyio

from roder_api.commands import Command, CommandContext
from roder_api.errors import PluginSettingsError
from roder_server import open_tenant_runtimes
from roder_temporal._dispatch import connect, running_worker
from roder_temporal._settings import SETTINGS_ID, TemporalSettings

_PREFIX = "roder temporal worker: "


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``roder temporal``'s sub-commands."""
    parser.epilog = """\
examples:
  roder temporal worker          answer runs of [temporal] task_queue until SIGINT/SIGTERM
  roder serve --dispatch temporal   accept runs over HTTP and schedule them on Temporal
(see docs/serve.md, "Runs on Temporal")"""
    actions = parser.add_subparsers(dest="temporal_action", metavar="ACTION", required=True)
    worker = actions.add_parser(
        "worker",
        help="answer runs scheduled on Temporal (no HTTP)",
        description="Answer runs scheduled on Temporal (no HTTP).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.epilog = """\
examples:
  roder temporal worker                    the [temporal] address, namespace and task_queue
  roder --config fleet.toml temporal worker   another configuration's store and queue
(one line on stderr per run it takes; SIGINT or SIGTERM stops it)"""


def _say(line: str) -> None:
    print(_PREFIX + line, file=sys.stderr, flush=True)


async def run(args: argparse.Namespace, context: CommandContext) -> int:
    """Run a worker until SIGINT or SIGTERM; return the exit code."""
    try:
        settings = TemporalSettings.from_table(context.plugin_settings.get(SETTINGS_ID))
    except PluginSettingsError as exc:
        print(f"roder temporal: error: [temporal] {exc.setting}: {exc.reason}", file=sys.stderr)
        return 1
    try:
        client = await connect(settings)
    except Exception as exc:  # noqa: BLE001 - any reason it cannot connect: say it, exit 1
        print(
            f"roder temporal: error: cannot reach Temporal at {settings.address}: {exc}",
            file=sys.stderr,
        )
        return 1
    owner = f"roder temporal worker ({socket.gethostname()}:{os.getpid()})"
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_tenant_runtimes(context) as (runtime, tenants):
            runtimes = {"": runtime, **tenants}
            async with running_worker(client, settings, runtimes, owner=owner, announce=_say):
                _say(
                    f"polling task queue {settings.task_queue} at {settings.address} "
                    f"(namespace {settings.namespace})"
                )
                async for _ in signals:
                    break
    return 0


TEMPORAL = Command(
    name="temporal",
    help="runs across a fleet on Temporal: roder temporal worker",
    configure=configure,
    run=run,
)
"""The ``roder temporal`` command."""
