"""The JSONL thread store: one append-only, checksummed journal file per thread.

A thin facade over the store kit's :class:`~roder_api.storekit.BlockingThreadStore`: the
reader (``_reader``), the writer (``_writer``) and fsck (``_fsck``) do the work, and
``group`` durability runs the writer's commits through :class:`~roder_api.storekit.
GroupCommit`. The file layout is described in ``_core``, the line format in ``_format``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roder_api.errors import StoreError, ThreadNotFoundError
from roder_api.events import Event, JournalEvent
from roder_api.storekit import (
    BlockingThreadStore,
    FileLeases,
    FollowOn,
    GroupCommit,
    RepairableThreadStore,
    run_in_worker,
)
from roder_api.threads import (
    EventPage,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    ThreadStoreFactory,
    validate_thread_id,
)
from roder_jsonl_thread_store._core import (
    DURABILITY_MODES,
    JOURNAL_SUFFIX,
    QUARANTINE_INFIX,
    StoreCore,
    fsync_dir,
)
from roder_jsonl_thread_store._format import events_list
from roder_jsonl_thread_store._reader import JournalReader
from roder_jsonl_thread_store._writer import SYNC_WORKERS, Commit, JournalWriter

if TYPE_CHECKING:  # fsck is imported when a check or repair first needs it (PEP 562 below)
    from roder_jsonl_thread_store._fsck import JournalChecker, ThreadCheck, ThreadRepair

__all__ = [
    "DURABILITY_MODES",
    "JOURNAL_SUFFIX",
    "QUARANTINE_INFIX",
    "SYNC_WORKERS",
    "JsonlThreadStore",
    "JsonlThreadStoreFactory",
    "ThreadCheck",
    "ThreadRepair",
]


def __getattr__(name: str) -> Any:
    # ThreadCheck and ThreadRepair live in fsck's module, imported on first use (PEP 562).
    if name in ("ThreadCheck", "ThreadRepair"):
        from roder_jsonl_thread_store import _fsck

        return getattr(_fsck, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class JsonlThreadStore(BlockingThreadStore, RepairableThreadStore):
    """A thread store of one ``<thread id>.jsonl`` journal per thread under ``base_path``.

    Each committed batch is one line written with one ``write`` and synced per the
    durability mode. Writers to one thread are serialised in this process and across
    processes (a lock file per thread; the OS releases the lock of a process that dies).
    Reads never write: a torn last line is skipped, and moved to a quarantine file by the
    next write to the thread; any other damage is refused with ``StoreCorruptedError`` and
    left for ``roder fsck --repair``. A store whose directory may not be written can still
    be read (its index is then kept in memory).

    A store object belongs to one event loop (group commit waits on anyio events); open one
    store per event loop or process.
    """

    store_name = "JSONL thread store"

    def __init__(
        self, base_path: Path, *, durability: str = "group", read_only: bool = False
    ) -> None:
        self._core = StoreCore(base_path, durability, read_only=read_only)
        self._reader = JournalReader(self._core)
        self._writer = JournalWriter(self._core, self._reader)
        self._fsck: JournalChecker | None = None  # made by the first check (`_checker`)
        self._leases = FileLeases(self._core.leases_dir)
        self._group: GroupCommit[Commit, Any] | None = None  # made in the loop, on first use

    @property
    def _checker(self) -> JournalChecker:
        # fsck's module is imported on first use: listing or running threads never needs it.
        if self._fsck is None:
            from roder_jsonl_thread_store._fsck import JournalChecker

            self._fsck = JournalChecker(self._core, self._reader, self._writer)
        return self._fsck

    @property
    def base_path(self) -> Path:
        """The store's directory."""
        return self._core.base_path

    @property
    def durability(self) -> str:
        """The durability mode: ``fsync``, ``group`` or ``none``."""
        return self._core.durability

    @property
    def threads_dir(self) -> Path:
        """The directory of the journals."""
        return self._core.threads_dir

    @property
    def index_path(self) -> Path:
        """The listing index file."""
        return self._core.index_path

    @property
    def _after_journal_write(self) -> Callable[[str], None] | None:
        # A test seam for crash tests (see JournalWriter.after_journal_write).
        return self._writer.after_journal_write

    @_after_journal_write.setter
    def _after_journal_write(self, hook: Callable[[str], None] | None) -> None:
        self._writer.after_journal_write = hook

    def journal_path(self, thread_id: str) -> Path:
        """Return the journal file of a thread (validating the id)."""
        return self._core.journal_path(thread_id)

    # --- the kit's hooks ------------------------------------------------------------------

    def _commit_one(self, commit: Commit) -> Any:
        outcome = self._writer.commit([commit])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def submit_append(
        self,
        thread_id: str,
        events: list[Event],
        payloads: list[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Commit one batch: through the group commit unless durability is ``fsync``.

        ``fsync`` syncs every commit on its own, as asked; ``group`` shares a sync among
        the commits that arrive meanwhile, and ``none`` (no sync) shares the write and the
        index update the same way — one thread hand-off per batch instead of per append.
        """
        if self.durability == "fsync":
            return await super().submit_append(thread_id, events, payloads, expected_last_sequence)
        if self._group is None:
            # The index rows are written after the callers are woken (the journal is the
            # truth; a row a crash loses is caught up from it).
            self._group = GroupCommit(
                functools.partial(self._writer.commit, defer_index=True),
                after=self._core.flush_rows_soon,
            )
        commit = self._writer.events_commit(
            thread_id, events_list(payloads), events, expected_last_sequence
        )
        result: list[JournalEvent] = await self._group.submit(commit)
        return result

    def close_sync(self) -> None:
        """Stop the committer and the sync workers, make the index durable, end the session."""
        if self._group is not None:
            self._group.close()  # what it was handed is written first
        self._writer.close()
        self._core.close()

    # --- the blocking methods -------------------------------------------------------------

    def create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create the thread's journal atomically (its metadata is the first line)."""
        return self._writer.create(metadata)

    def create_with_events_sync(
        self, metadata: ThreadMetadata, events: Sequence[Event], payloads: Sequence[bytes]
    ) -> list[JournalEvent]:
        """Create the journal with the events after its first line: one write, one sync of
        the file and one of its directory (a crash leaves all of it or nothing)."""
        return self._create(metadata, events, payloads, None)

    def create_with_follow_on_sync(
        self,
        metadata: ThreadMetadata,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        follow_on: FollowOn,
    ) -> list[JournalEvent]:
        """Create the journal with ``events``, and write what ``follow_on`` was offered
        meanwhile once it is linked, synced before the directory is (``JournalWriter.
        create``), rather than after the create in an append of its own. When that write
        fails the journal is cut back to ``events`` and ``follow_on.error`` says why; the
        thread stands."""
        return self._create(metadata, events, payloads, follow_on)

    def _create(
        self,
        metadata: ThreadMetadata,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        follow_on: FollowOn | None,
    ) -> list[JournalEvent]:
        commit = self._writer.events_commit(metadata.thread_id, events_list(payloads), list(events))
        self._writer.create(metadata, commit, follow_on)
        entries: list[JournalEvent] = commit.result
        return entries

    def get_sync(self, thread_id: str) -> ThreadMetadata:
        """Return the thread's metadata (the index row plus what the journal gained)."""
        return self._reader.metadata(thread_id)

    def update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        """Append one ``meta`` line."""
        result: ThreadMetadata = self._commit_one(self._writer.meta_commit(thread_id, changes))
        return result

    def append_sync(
        self,
        thread_id: str,
        events: Sequence[Event],
        payloads: Sequence[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        """Append one ``events`` line (conditionally, checked under the writer lock)."""
        commit = self._writer.events_commit(
            thread_id, events_list(payloads), events, expected_last_sequence
        )
        result: list[JournalEvent] = self._commit_one(commit)
        return result

    def import_sync(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> None:
        """Append one line per imported event (each keeps its recorded time)."""
        self._commit_one(self._writer.import_commit(thread_id, entries, payloads))

    def read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        """Stream the journal from the replay boundary, or from a binary-searched line."""
        if limit is not None and limit < 1:
            return []
        return self._reader.read(thread_id, after, None, limit, "replay" if replay else "seek")

    def snapshot_sync(self, thread_id: str) -> ThreadSnapshot:
        """Fold the journal straight into turns: one pass, no journal event per line."""
        return self._reader.snapshot(thread_id)

    def page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        """Return a page found by a binary search over the journal."""
        return self._reader.page(thread_id, before, limit)

    def list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        """Return a page of threads from the index."""
        return self._reader.list(cursor, limit)

    async def threads_with_pending_input(
        self, *, updated_after_ms: int = 0, limit: int = 100
    ) -> list[str]:
        """Return the threads with an open turn: one query of the index's ``open_turns``
        (see :meth:`ThreadStore.threads_with_pending_input`), caught up as a listing is."""
        return await self.run_sync(self._reader.pending, updated_after_ms, limit)

    def delete_sync(self, thread_id: str) -> None:
        """Delete the journal and its index row."""
        self._writer.delete(thread_id)

    def size_sync(self, thread_id: str) -> int | None:
        """Return the size of the thread's journal file in bytes."""
        try:
            return os.stat(self._core.journal_path(thread_id)).st_size
        except FileNotFoundError:
            raise ThreadNotFoundError(thread_id) from None

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return a context manager holding the thread's lease (``leases/<id>.lease``).

        An OS file lock: refused with ``ThreadBusyError`` naming the holder while another
        task or process holds it, released by the OS when the holder dies. A store opened
        read-only refuses with ``StoreError`` (a lease is a write).
        """
        if self._core.opened_read_only:
            return _refused_lease(self._core.base_path)
        return self._leases.lease(thread_id, owner=owner)

    def file_leases(self) -> FileLeases | None:
        """Return the store's file leases (None when opened read-only: its lease refuses)."""
        return None if self._core.opened_read_only else self._leases

    # --- checking and repairing (roder fsck) ----------------------------------------------

    async def journal_ids(self) -> list[str]:
        """Return the id of every journal on disk, sorted (whether or not it is indexed)."""
        return await self.run_sync(self._checker.journal_ids)

    async def check_thread(self, thread_id: str) -> ThreadCheck:
        """Return what a full check of a thread's journal and index row finds (no changes)."""
        validate_thread_id(thread_id)
        return await self.run_sync(self._checker.check, thread_id)

    async def repair_thread(self, thread_id: str) -> ThreadRepair:
        """Repair a thread: move a damaged tail to a quarantine file, fix its index row.

        Never deletes data: the damaged part (from the first bad line to the end) is copied
        to ``<journal>.quarantine-<ms>`` and synced before the journal is cut; a journal
        without a valid first line is renamed to its quarantine name as a whole.
        """
        validate_thread_id(thread_id)
        return await self.run_sync(self._checker.repair, thread_id)

    async def reindex_thread(self, thread_id: str) -> bool:
        """Rebuild a thread's index row from its journal; return True when it is indexed.

        A journal with damage keeps no row (repair it first).
        """
        validate_thread_id(thread_id)
        return await self.run_sync(self._checker.reindex_thread, thread_id)

    async def reindex(self) -> int:
        """Rebuild the whole listing index from the journals; return how many it holds."""
        count = 0
        for thread_id in await self.journal_ids():
            count += await self.reindex_thread(thread_id)
        await self.prune_index()
        return count

    async def prune_index(self) -> int:
        """Remove index rows whose journal no longer exists; return how many were removed."""
        return await self.run_sync(self._checker.prune_index)


@asynccontextmanager
async def _refused_lease(base_path: Path) -> AsyncIterator[ThreadLease]:
    raise StoreError(
        f"the JSONL store in {base_path} was opened read-only; a lease is a write: open it "
        "without read_only to run sessions"
    )
    yield  # pragma: no cover - never reached


class JsonlThreadStoreFactory(ThreadStoreFactory):
    """Opens JSONL thread stores under ``base_path`` (``durability``: group (default), fsync, none).

    ``must_exist``: refuse (``StoreError``, nothing created) unless ``base_path`` exists.
    ``read_only``: write nothing at all (the index is kept in memory; every write and lease
    raises ``StoreError``); implies ``must_exist``.
    """

    id = "jsonl"

    def __init__(
        self,
        base_path: str | os.PathLike[str],
        *,
        durability: str = "group",
        read_only: bool = False,
        must_exist: bool = False,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = Path(base_path).expanduser()
        self.durability = durability
        self.read_only = read_only
        self.must_exist = must_exist or read_only

    def _prepare(self) -> JsonlThreadStore:
        if not self.base_path.is_dir() and self.must_exist:
            raise StoreError(
                f"the JSONL store {self.base_path} does not exist; nothing was created "
                "(check the path)"
            )
        if not self.base_path.exists():
            # A new store: make its directories durable now. An existing one is left as it
            # is: its directories are made by the first write that needs them.
            for sub in ("threads", "tmp", "sessions"):
                (self.base_path / sub).mkdir(parents=True, exist_ok=True)
            if self.durability != "none":
                fsync_dir(self.base_path)
                fsync_dir(self.base_path.parent)
        store = JsonlThreadStore(
            self.base_path, durability=self.durability, read_only=self.read_only
        )
        store._reader.ensure_ready()
        return store

    async def open(self) -> JsonlThreadStore:
        """Return a store on ``base_path``, creating its directories (made durable).

        Opening checks for writers that died since the index was last updated and catches
        the index up from their journals (or builds it, the first time). A directory this
        process may not write is opened for reading, with the index kept in memory.
        """
        try:
            return await run_in_worker(self._prepare)
        except OSError as exc:
            raise StoreError(
                f"cannot use {self.base_path} for the JSONL thread store: {exc.strerror or exc}"
            ) from exc

    def describe(self) -> str:
        """Return where the journals live."""
        mode = ", read-only" if self.read_only else ""
        return f"jsonl at {self.base_path} (durability {self.durability}{mode})"
