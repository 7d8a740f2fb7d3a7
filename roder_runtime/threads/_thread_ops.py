"""Operations on a Runtime's threads outside a session: fork, read a journal, measure, prune.

Each takes the :class:`~roder_runtime.Runtime` and reaches the store only through it: the
runtime's thread methods, or a thread's :meth:`~roder_runtime.Runtime.journal`, whose every
call is bounded by the runtime's store deadline (``turn_timeout_s``). Public through
:mod:`roder_runtime.threads`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from roder_api.codec import dumps as codec_dumps
from roder_api.errors import (
    SequenceConflictError,
    StoreCorruptedError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from roder_api.events import JournalEvent
from roder_api.threads import ThreadMetadata, ThreadStore
from roder_runtime.store._journal import DEFAULT_STORE_TIMEOUT_S, bounded_call, store_label

if TYPE_CHECKING:  # only for annotations: the runtime does not import this module
    from roder_runtime._runtime import Runtime

T = TypeVar("T")

Progress = Callable[[int, int], None]
"""Called with (done, total) as an operation advances: what a progress bar needs."""

LISTING_PAGE = 500
"""Threads read per listing page."""


async def store_call(runtime: Runtime, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """Return ``await call()`` within the runtime's store deadline (``turn_timeout_s``), for
    a store call that concerns no one thread (one that does goes through its journal)."""
    limit = runtime.config.turn_timeout_s
    return await bounded_call(
        what,
        call,
        store_name=store_label(runtime.thread_store_factory()),
        timeout_s=limit if limit is not None else DEFAULT_STORE_TIMEOUT_S,
    )


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What :func:`fork_thread` made: the new thread and how many events it copied."""

    thread: ThreadMetadata
    events_copied: int


async def fork_thread(
    runtime: Runtime, source_id: str, *, at: int | None = None, title: str | None = None
) -> ForkResult:
    """Return a new thread holding ``source_id``'s events up to ``at`` (all when None).

    The events are imported verbatim (same sequence numbers and times); the source is only
    read, so forking works while a session holds the source. The fork's ``extra`` is the
    source's plus ``forked_from`` ``{thread_id, sequence}``; its title the source's plus
    `` (fork)`` unless ``title`` is given.

    A write outside a session, on a thread nobody else knows yet: it takes no lease. What
    excludes a racing writer is the import's condition: events 1..N continue the fork's
    journal only while it is empty, checked and written as one step by the store, so if
    someone wrote to the new thread first, ``SequenceConflictError`` is raised, nothing is
    copied and their events are left as they are. The read needs no condition: journals
    are append-only, so events 1..N of the source are final. Any other failure deletes
    the half-made fork. ``ValueError`` when ``at`` is past the source's last event;
    ``StoreCorruptedError`` when the source does not hold events 1..N.
    """
    source_journal = await runtime.journal(source_id)
    store = source_journal.store
    source = await source_journal.bounded("metadata read", lambda: store.get_thread(source_id))
    last = source.last_sequence
    sequence = last if at is None else at
    if sequence > last:
        raise ValueError(
            f"fork point {sequence} is past the end of thread {source_id} (its last event is "
            f"{last}; see `roder threads show {source_id} --events`)"
        )
    entries: list[JournalEvent] = []
    if sequence:
        entries = await source_journal.bounded(
            "read", lambda: store.read_events(source_id, limit=sequence)
        )
    if [e.sequence for e in entries] != list(range(1, sequence + 1)):
        raise StoreCorruptedError(
            f"thread {source_id}'s journal does not hold events 1..{sequence}; nothing was "
            "forked (run `roder fsck`)",
            thread_id=source_id,
        )
    if title is None and source.title:
        title = f"{source.title} (fork)"
    extra = {**source.extra, "forked_from": {"thread_id": source_id, "sequence": sequence}}
    fork = await runtime.create_thread(uuid.uuid4().hex, title=title, extra=extra)
    fork_journal = await runtime.journal(fork.thread_id)
    try:
        if entries:
            await fork_journal.bounded(
                "import", lambda: fork_journal.store.import_events(fork.thread_id, entries)
            )
    except SequenceConflictError as exc:
        raise SequenceConflictError(
            fork.thread_id,
            exc.expected,
            exc.actual,
            message=(
                f"thread {fork.thread_id} was written to during the fork by someone else; "
                f"nothing was copied and it is left as it is (inspect it with `roder threads "
                f"show {fork.thread_id}`), then fork again"
            ),
        ) from exc
    except BaseException:
        # Leave no half-made fork behind.
        try:
            await fork_journal.bounded(
                "delete", lambda: fork_journal.store.delete_thread(fork.thread_id)
            )
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise
    return ForkResult(await runtime.get_thread(fork.thread_id), len(entries))


async def read_journal(
    runtime: Runtime, thread_id: str
) -> tuple[ThreadMetadata, list[JournalEvent]]:
    """Return a thread's metadata and its journal events 1..``last_sequence`` of it.

    The events are those the metadata describes, though writers may go on meanwhile
    (``roder threads show --events`` and ``export --format jsonl``). A read: no lease.
    """
    journal = await runtime.journal(thread_id)
    store = journal.store
    metadata = await journal.bounded("metadata read", lambda: store.get_thread(thread_id))
    last = metadata.last_sequence
    if last < 1:
        return metadata, []
    return metadata, await journal.bounded("read", lambda: store.read_events(thread_id, limit=last))


async def all_threads(runtime: Runtime) -> list[ThreadMetadata]:
    """Return every thread's metadata, newest update first (paging through the listing)."""
    threads: list[ThreadMetadata] = []
    cursor: str | None = None
    while True:
        page = await runtime.list_threads(cursor=cursor, limit=LISTING_PAGE)
        threads.extend(page.threads)
        if page.next_cursor is None:
            return threads
        cursor = page.next_cursor


async def thread_size(store: ThreadStore, thread_id: str) -> tuple[int, bool]:
    """Return a thread's size in bytes and whether it is exact (else estimated).

    Stores that cannot tell (``thread_size_bytes`` returns None) get the size of the
    journal serialised as JSON lines. Unbounded: :func:`plan_prune` calls it within the
    runtime's deadline.
    """
    size = await store.thread_size_bytes(thread_id)
    if size is not None:
        return size, True
    entries = await store.read_events(thread_id)
    return sum(len(codec_dumps(e)) + 1 for e in entries), False


@dataclass(frozen=True, slots=True)
class PrunableThread:
    """A thread :func:`plan_prune` found old enough, with its size in bytes."""

    metadata: ThreadMetadata
    size_bytes: int
    size_exact: bool
    """False when the store could not tell and the size is the journal's as JSON lines."""


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """The threads last updated before ``older_than_ms`` beyond the newest ``keep_last``."""

    older_than_ms: int
    keep_last: int
    thread_count: int
    """How many threads the store held when it was listed."""
    threads: tuple[PrunableThread, ...]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune_threads` deleted, and the threads it kept because a session held
    them (each with the ``ThreadBusyError`` naming the holder)."""

    deleted: tuple[PrunableThread, ...]
    busy: tuple[tuple[PrunableThread, ThreadBusyError], ...] = ()


async def plan_prune(
    runtime: Runtime,
    *,
    older_than_ms: int,
    keep_last: int = 0,
    on_progress: Progress | None = None,
) -> PrunePlan:
    """Return the threads not updated since ``older_than_ms`` (epoch milliseconds), keeping
    the newest ``keep_last`` whatever their age, each measured. A read: deletes nothing.

    ``on_progress(done, total)`` is called as the threads are measured.
    """
    threads = await all_threads(runtime)
    candidates = [m for m in threads[keep_last:] if m.updated_at_ms < older_than_ms]
    found: list[PrunableThread] = []
    for done, meta in enumerate(candidates, start=1):
        journal = await runtime.journal(meta.thread_id)
        try:
            size, exact = await journal.bounded(
                "size", functools.partial(thread_size, journal.store, meta.thread_id)
            )
        except ThreadNotFoundError:
            pass  # deleted meanwhile
        else:
            found.append(PrunableThread(meta, size, exact))
        if on_progress is not None:
            on_progress(done, len(candidates))
    return PrunePlan(older_than_ms, keep_last, len(threads), tuple(found))


async def prune_threads(
    runtime: Runtime, plan: PrunePlan, *, on_progress: Progress | None = None
) -> PruneResult:
    """Delete the threads of ``plan`` that are still old; return what was deleted.

    A thread written to since the plan was made (updated at or after ``older_than_ms``) is
    no longer old and is kept; one deleted meanwhile is skipped. Each delete is
    :meth:`Runtime.delete_thread <roder_runtime.Runtime.delete_thread>`: it takes the
    thread's lease, so a thread a session holds is kept and reported in ``busy`` with the
    ``ThreadBusyError`` naming the holder (the other threads are still pruned).
    ``on_progress(done, total)`` is called after each thread.
    """
    deleted: list[PrunableThread] = []
    busy: list[tuple[PrunableThread, ThreadBusyError]] = []
    for done, item in enumerate(plan.threads, start=1):
        try:
            current = await runtime.get_thread(item.metadata.thread_id)
            if current.updated_at_ms < plan.older_than_ms:
                await runtime.delete_thread(item.metadata.thread_id)
                deleted.append(item)
        except ThreadNotFoundError:
            pass
        except ThreadBusyError as exc:
            busy.append((item, exc))
        if on_progress is not None:
            on_progress(done, len(plan.threads))
    return PruneResult(tuple(deleted), tuple(busy))
