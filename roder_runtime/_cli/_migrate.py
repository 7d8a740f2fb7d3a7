"""``roder migrate``: copy every thread from one store to another, verbatim and verified.

Each thread is created at the target with the source's metadata and its journal is copied
with ``import_events`` in chunks: same events, same sequence numbers, same times. A thread
already complete at the target is skipped; one copied in part goes on from its last
sequence, so an interrupted migration is simply run again. A title or ``extra`` changed at
the source since an earlier run is updated at the target (and reported), so re-runs
converge. Every thread is then verified: its event count, its metadata and a SHA-256 of its
journal must match on both sides.

The source is only read. A source that does not exist is an error (exit 1) and nothing is
created anywhere: not the source (a mistyped path would otherwise become an empty store)
and not the target.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio

from roder_api.codec import dumps, to_dict
from roder_api.errors import StoreError, ThreadNotFoundError, UnknownThreadStoreError
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.threads import ThreadMetadata, ThreadStore, ThreadStoreFactory
from roder_runtime._cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    add_command,
    add_json_flag,
    print_json,
    progress,
)

LOCATION_KEYS: Mapping[str, str] = {"postgres": "dsn"}
"""The settings key the ``LOCATION`` of ``STORE:LOCATION`` fills (``path`` for the others)."""

DEFAULT_CHUNK = 1000

_COMPARED_FIELDS = (
    "created_at_ms",
    "title",
    "extra",
    "usage",
    "item_count",
    "last_sequence",
)
# ``updated_at_ms`` is compared apart: a metadata update at the target happens later than
# the source's, so the target's may be newer, never older.

_UPDATABLE_FIELDS = ("title", "extra")
"""The metadata a re-run brings up to date at the target."""


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


def source_location(factory: ThreadStoreFactory, settings: Mapping[str, Any]) -> str | None:
    """Return the file or directory a file-based store keeps its threads in, else None.

    The ``path`` setting when given; otherwise the factory's own ``path`` / ``base_path``
    (its default location). Stores in a server (PostgreSQL) have none.
    """
    location = settings.get("path")
    if location is None:
        for name in ("path", "base_path"):
            value = getattr(factory, name, None)
            if isinstance(value, (str, os.PathLike)):
                location = value
                break
    return None if location is None else os.path.expanduser(os.fspath(location))


async def require_existing_source(factory: ThreadStoreFactory, settings: Mapping[str, Any]) -> None:
    """Raise ``CommandError`` (exit 1) when the source store's file or directory is missing."""
    location = source_location(factory, settings)
    if location is None:
        return
    if not await anyio.Path(location).exists():
        raise CommandError(
            f"the source store does not exist: {location} ({factory.describe()}); check --from "
            "(nothing was created or copied)",
            EXIT_FAILURE,
        )


@dataclass
class ThreadResult:
    """What ``roder migrate`` did to one thread."""

    thread_id: str
    status: str  # copied, resumed, updated, skipped or failed
    events: int = 0
    events_copied: int = 0
    checksum: str | None = None
    error: str | None = None
    updated_fields: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Return the result as JSON data."""
        return {
            "thread_id": self.thread_id,
            "status": self.status,
            "events": self.events,
            "events_copied": self.events_copied,
            "checksum": self.checksum,
            "error": self.error,
            "updated_fields": list(self.updated_fields),
        }


@dataclass
class MigrationReport:
    """What ``roder migrate`` did, thread by thread."""

    source: str
    target: str
    results: list[ThreadResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        """Return how many threads ended with ``status``."""
        return sum(1 for r in self.results if r.status == status)

    def to_json(self) -> dict[str, Any]:
        """Return the report ``--json`` prints."""
        return {
            "from": self.source,
            "to": self.target,
            "threads": len(self.results),
            "copied": self.count("copied"),
            "resumed": self.count("resumed"),
            "updated": sum(1 for r in self.results if r.updated_fields),
            "skipped": self.count("skipped"),
            "failed": self.count("failed"),
            "events_copied": sum(r.events_copied for r in self.results),
            "verified": sum(1 for r in self.results if r.status != "failed"),
            "results": [r.to_json() for r in self.results],
        }


async def _journal_digest(store: ThreadStore, thread_id: str, chunk: int) -> tuple[int, str]:
    """Return the number of events of a journal and a SHA-256 of their canonical JSON."""
    digest = hashlib.sha256()
    count = 0
    after = 0
    while True:
        entries = await store.read_events(thread_id, after=after, limit=chunk)
        if not entries:
            return count, digest.hexdigest()
        for entry in entries:
            digest.update(dumps(entry))
            digest.update(b"\n")
        count += len(entries)
        after = entries[-1].sequence


def _metadata_differences(source: ThreadMetadata, target: ThreadMetadata) -> list[str]:
    left, right = to_dict(source), to_dict(target)
    differences = [name for name in _COMPARED_FIELDS if left.get(name) != right.get(name)]
    if target.updated_at_ms < source.updated_at_ms:
        differences.append("updated_at_ms")
    return differences


async def _update_metadata(source: ThreadStore, target: ThreadStore, thread_id: str) -> list[str]:
    """Bring the target's title and ``extra`` up to the source's; return what changed."""
    wanted = to_dict(await source.get_thread(thread_id))
    have = to_dict(await target.get_thread(thread_id))
    changed = [name for name in _UPDATABLE_FIELDS if wanted.get(name) != have.get(name)]
    if changed:
        fields = {name: getattr(await source.get_thread(thread_id), name) for name in changed}
        await target.update_thread(thread_id, **fields)
    return changed


async def migrate_thread(
    source: ThreadStore, target: ThreadStore, metadata: ThreadMetadata, *, chunk: int
) -> ThreadResult:
    """Copy one thread (or the rest of it) from ``source`` to ``target`` and verify it."""
    thread_id = metadata.thread_id
    try:
        existing = await target.get_thread(thread_id)
    except ThreadNotFoundError:
        existing = await target.create_thread(metadata)
        status = "copied"
    else:
        status = "resumed"
        if existing.created_at_ms != metadata.created_at_ms:
            return ThreadResult(
                thread_id,
                "failed",
                error="the target holds a different thread with this id (other creation time)",
            )
        if existing.last_sequence > metadata.last_sequence:
            return ThreadResult(
                thread_id,
                "failed",
                error=(
                    f"the target's journal is longer ({existing.last_sequence} events) than "
                    f"the source's ({metadata.last_sequence})"
                ),
            )
    after = existing.last_sequence
    copied = 0
    while after < metadata.last_sequence:
        limit = min(chunk, metadata.last_sequence - after)
        entries = await source.read_events(thread_id, after=after, limit=limit)
        if not entries:
            break
        await target.import_events(thread_id, entries)
        copied += len(entries)
        after = entries[-1].sequence
    updated = [] if status == "copied" else await _update_metadata(source, target, thread_id)
    if status == "resumed" and copied == 0:
        status = "updated" if updated else "skipped"
    source_count, source_sum = await _journal_digest(source, thread_id, chunk)
    target_count, target_sum = await _journal_digest(target, thread_id, chunk)
    result = ThreadResult(thread_id, status, source_count, copied, source_sum)
    result.updated_fields = updated
    if (source_count, source_sum) != (target_count, target_sum):
        result.status = "failed"
        result.error = (
            f"verification failed: source has {source_count} events (sha256 {source_sum[:12]}), "
            f"target {target_count} (sha256 {target_sum[:12]})"
        )
        return result
    differences = _metadata_differences(
        await source.get_thread(thread_id), await target.get_thread(thread_id)
    )
    if differences:
        result.status = "failed"
        result.error = "metadata differs after the copy: " + ", ".join(differences)
    return result


async def list_all_threads(store: ThreadStore) -> list[ThreadMetadata]:
    """Return the metadata of every thread of ``store``, newest first."""
    threads: list[ThreadMetadata] = []
    cursor: str | None = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=500)
        threads.extend(page.threads)
        if page.next_cursor is None:
            return threads
        cursor = page.next_cursor


async def migrate(
    source_factory: ThreadStoreFactory,
    target_factory: ThreadStoreFactory,
    *,
    chunk: int = DEFAULT_CHUNK,
    show_progress: bool = True,
    on_result: Callable[[ThreadResult], None] | None = None,
) -> MigrationReport:
    """Copy every thread of ``source_factory``'s store to ``target_factory``'s; verify each."""
    report = MigrationReport(source_factory.describe(), target_factory.describe())
    async with AsyncExitStack() as stack:
        source = await source_factory.open()
        stack.push_async_callback(source.aclose)
        target = await target_factory.open()
        stack.push_async_callback(target.aclose)
        threads = await list_all_threads(source)
        # Oldest first: a resumed run reaches the threads it had not started in the same order.
        threads.reverse()
        for metadata in progress(
            threads, total=len(threads), desc="migrating threads", quiet=not show_progress
        ):
            try:
                result = await migrate_thread(source, target, metadata, chunk=chunk)
            except ThreadNotFoundError:
                continue  # deleted at the source while we were migrating
            except StoreError as exc:
                result = ThreadResult(metadata.thread_id, "failed", error=str(exc))
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    return report


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
    # Before anything opens a store: opening a missing one would create it.
    await require_existing_source(source_factory, source_settings)
    target_factory = build_factory(target_id, target_settings)
    report = await migrate(
        source_factory, target_factory, chunk=args.chunk, show_progress=not args.json
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
