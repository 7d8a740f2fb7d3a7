"""Copy every thread from one store to another, verbatim and verified (``roder migrate``).

Each thread is created at the target with the source's metadata and its journal is copied
with ``import_events`` in chunks: same events, same sequence numbers, same times. A thread
already complete at the target is skipped; one copied in part goes on from its last
sequence, so an interrupted migration is simply run again. A title or ``extra`` changed at
the source since an earlier run is updated at the target (and reported), so re-runs
converge. Every thread is then verified: its event count, its metadata and a SHA-256 of its
journal must match on both sides. Every store call is bounded by the runtime's store
deadline (``bounded_call``). Public through :mod:`roder_runtime.threads`.

The source is only read. A source that does not exist is an error and nothing is created
anywhere: not the source (a mistyped path would otherwise become an empty store) and not
the target.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import anyio

from roder_api.codec import dumps, to_dict
from roder_api.errors import StoreError, ThreadNotFoundError
from roder_api.threads import ThreadMetadata, ThreadStore, ThreadStoreFactory
from roder_runtime.store._journal import DEFAULT_STORE_TIMEOUT_S, bounded_call
from roder_runtime.threads._thread_ops import Progress

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_CHUNK = 1000
"""Events per import transaction."""

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


@dataclass
class ThreadResult:
    """What a migration did to one thread."""

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
    """What a migration did, thread by thread."""

    source: str
    target: str
    results: list[ThreadResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        """Return how many threads ended with ``status``."""
        return sum(1 for r in self.results if r.status == status)

    def to_json(self) -> dict[str, Any]:
        """Return the report ``roder migrate --json`` prints."""
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


@dataclass(frozen=True, slots=True)
class _Side:
    """One store of a migration, each call bounded by the deadline and named in its error."""

    store: ThreadStore
    name: str
    timeout_s: float

    async def call(
        self, what: str, method: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        return await bounded_call(
            what,
            functools.partial(method, *args, **kwargs),
            store_name=self.name,
            timeout_s=self.timeout_s,
        )


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
    """Raise ``StoreError`` when the source store's file or directory is missing."""
    location = source_location(factory, settings)
    if location is None:
        return
    if not await anyio.Path(location).exists():
        raise StoreError(
            f"the source store does not exist: {location} ({factory.describe()}); check --from "
            "(nothing was created or copied)"
        )


async def _journal_digest(side: _Side, thread_id: str, chunk: int) -> tuple[int, str]:
    """Return the number of events of a journal and a SHA-256 of their canonical JSON."""
    digest = hashlib.sha256()
    count = 0
    after = 0
    while True:
        entries = await side.call(
            f"read of thread {thread_id!r}",
            side.store.read_events,
            thread_id,
            after=after,
            limit=chunk,
        )
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


async def _metadata(side: _Side, thread_id: str) -> ThreadMetadata:
    return await side.call(
        f"metadata read of thread {thread_id!r}", side.store.get_thread, thread_id
    )


async def _update_metadata(source: _Side, target: _Side, thread_id: str) -> list[str]:
    """Bring the target's title and ``extra`` up to the source's; return what changed."""
    wanted_meta = await _metadata(source, thread_id)
    wanted, have = to_dict(wanted_meta), to_dict(await _metadata(target, thread_id))
    changed = [name for name in _UPDATABLE_FIELDS if wanted.get(name) != have.get(name)]
    if changed:
        fields = {name: getattr(wanted_meta, name) for name in changed}
        await target.call(
            f"metadata update of thread {thread_id!r}",
            target.store.update_thread,
            thread_id,
            **fields,
        )
    return changed


async def migrate_thread(
    source: ThreadStore,
    target: ThreadStore,
    metadata: ThreadMetadata,
    *,
    chunk: int,
    timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
) -> ThreadResult:
    """Copy one thread (or the rest of it) from ``source`` to ``target`` and verify it.

    Each store call is bounded by ``timeout_s`` (``StoreError`` naming the store when late).
    """
    return await _migrate_thread(
        _Side(source, "the source store", timeout_s),
        _Side(target, "the target store", timeout_s),
        metadata,
        chunk=chunk,
    )


async def _migrate_thread(
    source: _Side, target: _Side, metadata: ThreadMetadata, *, chunk: int
) -> ThreadResult:
    thread_id = metadata.thread_id
    try:
        existing = await _metadata(target, thread_id)
    except ThreadNotFoundError:
        existing = await target.call(
            f"create of thread {thread_id!r}", target.store.create_thread, metadata
        )
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
        entries = await source.call(
            f"read of thread {thread_id!r}",
            source.store.read_events,
            thread_id,
            after=after,
            limit=limit,
        )
        if not entries:
            break
        await target.call(
            f"import of thread {thread_id!r}", target.store.import_events, thread_id, entries
        )
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
        await _metadata(source, thread_id), await _metadata(target, thread_id)
    )
    if differences:
        result.status = "failed"
        result.error = "metadata differs after the copy: " + ", ".join(differences)
    return result


async def _all_threads(side: _Side) -> list[ThreadMetadata]:
    """Return the metadata of every thread of a store, newest first."""
    threads: list[ThreadMetadata] = []
    cursor: str | None = None
    while True:
        page = await side.call("listing", side.store.list_threads, cursor=cursor, limit=500)
        threads.extend(page.threads)
        if page.next_cursor is None:
            return threads
        cursor = page.next_cursor


async def migrate(
    source_factory: ThreadStoreFactory,
    target_factory: ThreadStoreFactory,
    *,
    chunk: int = DEFAULT_CHUNK,
    timeout_s: float | None = None,
    on_progress: Progress | None = None,
    on_result: Callable[[ThreadResult], None] | None = None,
    source_settings: Mapping[str, Any] | None = None,
) -> MigrationReport:
    """Copy every thread of ``source_factory``'s store to ``target_factory``'s; verify each.

    Return the report, thread by thread; a thread that fails (verification, a store error)
    is reported ``failed`` and the others go on. ``chunk`` events go in one import
    transaction. Every store call is bounded by ``timeout_s`` (default two minutes, the
    runtime's store deadline when ``turn_timeout_s`` is unset). ``on_progress(done, total)``
    is called after each thread and ``on_result`` with each thread's result.

    With ``source_settings`` (the source factory's settings), a file-based source that does
    not exist raises ``StoreError`` before any store is opened, so nothing is created.

    A write outside any session, to the target: no lease is taken, and imports are
    conditional (each continues the target's journal only where it ends, else
    ``SequenceConflictError``, reported as the thread's failure). Stop writers to the
    source first, or run it again: a re-run copies what was appended meanwhile.
    """
    if chunk < 1:
        raise ValueError("chunk must be at least 1")
    if source_settings is not None:
        await require_existing_source(source_factory, source_settings)
    limit = timeout_s if timeout_s is not None else DEFAULT_STORE_TIMEOUT_S
    report = MigrationReport(source_factory.describe(), target_factory.describe())
    async with AsyncExitStack() as stack:
        source = await source_factory.open()
        stack.push_async_callback(source.aclose)
        target = await target_factory.open()
        stack.push_async_callback(target.aclose)
        source_side = _Side(source, f"the source store {source_factory.id!r}", limit)
        target_side = _Side(target, f"the target store {target_factory.id!r}", limit)
        threads = await _all_threads(source_side)
        # Oldest first: a resumed run reaches the threads it had not started in the same order.
        threads.reverse()
        for done, metadata in enumerate(threads, start=1):
            try:
                result = await _migrate_thread(source_side, target_side, metadata, chunk=chunk)
            except ThreadNotFoundError:
                result = None  # deleted at the source while we were migrating
            except StoreError as exc:
                result = ThreadResult(metadata.thread_id, "failed", error=str(exc))
            if result is not None:
                report.results.append(result)
                if on_result is not None:
                    on_result(result)
            if on_progress is not None:
                on_progress(done, len(threads))
    return report
