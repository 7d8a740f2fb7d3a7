"""``roder migrate``: copy every thread from one store to another, verbatim and verified.

The command parses ``STORE:LOCATION``, builds the two store factories from the installed
plugins, and calls :func:`roder_runtime.threads.migrate`, which does the work (its module
says how); then it prints the report.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roder_api.errors import UnknownThreadStoreError
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.threads import ThreadStoreFactory
from roder_runtime import threads
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_command,
    add_json_flag,
    print_json,
    progress_callback,
)
from roder_runtime.threads._migration import DEFAULT_CHUNK, MigrationReport, ThreadResult

LOCATION_KEYS: Mapping[str, str] = {"postgres": "dsn"}
"""The settings key the ``LOCATION`` of ``STORE:LOCATION`` fills (``path`` for the others)."""


def register(subparsers: Any) -> None:
    """Add the ``migrate`` command."""
    parser = add_command(
        subparsers,
        "migrate",
        help="copy every thread from one store to another, verified",
        description=(
            "Copy every thread with its full journal (same events, sequence numbers and "
            "metadata) from one thread store to another, then verify counts, metadata and a "
            "checksum per thread. Resumable and idempotent: run it again after an "
            "interruption; threads already complete at the target are skipped. STORE:LOCATION "
            "is a store id and its path (its DSN for postgres); an empty LOCATION uses the "
            "store's default (e.g. RODER_POSTGRES_DSN). Stop writers first, or run it again."
        ),
        examples=(
            "roder migrate --from jsonl:~/.roder/threads --to sqlite:~/.roder/threads.db",
            "roder migrate --from sqlite:threads.db --to postgres:postgresql://db.internal/agents",
            "roder migrate --from jsonl:old --to postgres: --to-option schema=agents --json",
        ),
    )
    parser.add_argument(
        "--from", dest="source", required=True, metavar="STORE:LOCATION", help="copy from"
    )
    parser.add_argument(
        "--to", dest="target", required=True, metavar="STORE:LOCATION", help="copy to"
    )
    parser.add_argument(
        "--from-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another setting of the source store (repeatable), e.g. durability=none",
    )
    parser.add_argument(
        "--to-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another setting of the target store (repeatable), e.g. schema=agents",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=DEFAULT_CHUNK,
        metavar="N",
        help=f"events per import transaction (default {DEFAULT_CHUNK})",
    )
    add_json_flag(parser)
    parser.set_defaults(handler=migrate_command)


def parse_store_spec(spec: str, options: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Return the store id and settings table of ``STORE:LOCATION`` plus ``KEY=VALUE`` options."""
    store_id, sep, location = spec.partition(":")
    if not sep or not store_id:
        raise CommandError(
            f"expected STORE:LOCATION (for example jsonl:PATH or postgres:DSN), got {spec!r}",
            EXIT_USAGE,
        )
    settings: dict[str, Any] = {}
    if location:
        settings[LOCATION_KEYS.get(store_id, "path")] = location
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise CommandError(f"expected KEY=VALUE, got {option!r}", EXIT_USAGE)
        settings[key] = value
    return store_id, settings


def build_factory(store_id: str, settings: Mapping[str, Any]) -> ThreadStoreFactory:
    """Return the factory of ``store_id`` from the installed plugins, given its settings."""
    builder = ExtensionRegistryBuilder(settings={store_id: settings})
    infos = builder.load_entry_points()
    try:
        return builder.build().thread_store_factory(store_id)
    except UnknownThreadStoreError as exc:
        failed = [f"{info.name} ({info.error})" for info in infos if info.error]
        hint = f"; plugins that failed to load: {', '.join(failed)}" if failed else ""
        raise CommandError(f"{exc}{hint}") from None


async def migrate(
    source_factory: ThreadStoreFactory,
    target_factory: ThreadStoreFactory,
    *,
    chunk: int = DEFAULT_CHUNK,
    show_progress: bool = True,
    on_result: Callable[[ThreadResult], None] | None = None,
) -> MigrationReport:
    """Return :func:`roder_runtime.threads.migrate`'s report, drawing its progress bar."""
    with progress_callback("migrating threads", quiet=not show_progress) as on_progress:
        return await threads.migrate(
            source_factory,
            target_factory,
            chunk=chunk,
            on_progress=on_progress,
            on_result=on_result,
        )


async def migrate_command(args: argparse.Namespace) -> int:
    """Copy every thread from ``--from`` to ``--to`` and report what was done."""
    if args.chunk < 1:
        raise CommandError("--chunk must be at least 1", EXIT_USAGE)
    source_id, source_settings = parse_store_spec(args.source, args.from_option)
    target_id, target_settings = parse_store_spec(args.target, args.to_option)
    if (source_id, source_settings) == (target_id, target_settings):
        raise CommandError("--from and --to name the same store", EXIT_USAGE)
    # Only read the source: stores that support it open read-only (which implies that the
    # store must already exist); an explicit --from-option read_only=... wins.
    source_settings.setdefault("read_only", True)
    source_factory = build_factory(source_id, source_settings)
    target_factory = build_factory(target_id, target_settings)
    with progress_callback("migrating threads", quiet=args.json) as on_progress:
        # With the source's settings: a missing source fails before any store is opened.
        report = await threads.migrate(
            source_factory,
            target_factory,
            chunk=args.chunk,
            on_progress=on_progress,
            source_settings=source_settings,
        )
    failed = report.count("failed")
    if args.json:
        print_json(report.to_json())
    else:
        summary = report.to_json()
        print(f"from {report.source}\nto   {report.target}")
        print(
            f"{summary['threads']} threads: {summary['copied']} copied, "
            f"{summary['resumed']} resumed, {summary['updated']} metadata updated, "
            f"{summary['skipped']} already complete, "
            f"{failed} failed; {summary['events_copied']} events copied"
        )
        for result in report.results:
            if result.status == "failed":
                print(f"FAILED {result.thread_id}: {result.error}")
            elif result.updated_fields:
                print(f"updated {result.thread_id}: {', '.join(result.updated_fields)}")
        if not failed:
            print("every thread verified (event count, metadata and checksum)")
    return EXIT_FAILURE if failed else EXIT_OK
