"""What the reader, the writer and fsck of one JSONL store share: paths, caches, the index,
the quarantine of a torn tail.

Layout under ``base_path``::

    threads/<thread id>.jsonl   the journals (the truth)
    index.sqlite3               the listing index (a cache of every journal's state)
    leases/<thread id>.lease    one session lease per thread (flock, holder JSON inside)
    sessions/*.session          liveness markers of stores that write (see ``_reader``)
    tmp/                        new journals before they are linked into place

The writer lock of a thread is a ``flock`` on its journal (see ``_locks``); older stores may
have a ``locks/`` directory, which nothing uses now.

Only writes create directories and files; a store that only reads changes nothing on disk.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from roder_api.codec import dumps_json, to_dict
from roder_api.errors import StoreCorruptedError, StoreError
from roder_api.storekit import WorkerCall, start_in_worker
from roder_api.threads import ThreadMetadata, validate_thread_id
from roder_jsonl_thread_store._format import FORMAT_VERSION
from roder_jsonl_thread_store._index import IndexRow, IndexUnavailable, PendingRow, ThreadIndex
from roder_jsonl_thread_store._journal import NEWER_VERSION, Damage, JournalState
from roder_jsonl_thread_store._locks import WriterMarker

log = logging.getLogger("roder.jsonl")

DURABILITY_MODES = ("fsync", "group", "none")
"""``fsync``: each commit synced before it returns; ``group``: concurrent commits share one
sync, each still durable before it returns; ``none``: handed to the OS only."""

JOURNAL_SUFFIX = ".jsonl"
QUARANTINE_INFIX = ".quarantine-"

INDEX_FLUSH_INTERVAL_S = 0.1
"""How often, at most, a group commit writes its deferred index rows (a thread's newest row
wins): back-to-back appends share one index write; a create's row waits this long. Readers
in this process write them first; another process's listing may lag the journals by about
this much. A deferred row is skipped when its journal changed since (see ``_StateRow``).

0.1 s, not 0.01: under ``roder serve`` (a response every ~10 ms) a flush every 10 ms was one
more worker call per response, often in the next response's path to its first delta;
``openai_bench.py --against`` measured 0.1 s at -0.15 to -0.49 ms paired (new and one
conversation)."""

datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def fsync_dir(path: Path) -> None:
    """Sync a directory (so that a file created or renamed in it survives a power cut)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def now_ms() -> int:
    """Return the wall-clock time in milliseconds."""
    return int(time.time() * 1000)


def disk_hint(exc: OSError) -> str:
    """Return advice for a failed write: free space when the disk is full."""
    return "; free disk space and retry" if exc.errno == errno.ENOSPC else ""


def metadata_json(meta: ThreadMetadata) -> bytes:
    """Return the codec JSON of thread metadata (what ``to_dict`` gives, built directly).

    Every commit writes it to the index; the generic encoder costs several times more.
    """
    if meta.unknown_fields or meta.usage.unknown_fields or type(meta) is not ThreadMetadata:
        return dumps_json(to_dict(meta))
    usage = meta.usage
    return dumps_json(
        {
            "type": "thread_metadata",
            "thread_id": meta.thread_id,
            "created_at_ms": meta.created_at_ms,
            "updated_at_ms": meta.updated_at_ms,
            "title": meta.title,
            "usage": {
                "type": "token_usage",
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
                "cached_prompt_tokens": usage.cached_prompt_tokens,
                "cache_creation_prompt_tokens": usage.cache_creation_prompt_tokens,
                "reasoning_tokens": usage.reasoning_tokens,
            },
            "item_count": meta.item_count,
            "last_sequence": meta.last_sequence,
            "extra": meta.extra,
            "open_turns": meta.open_turns,
        }
    )


def damage_error(thread_id: str, path: Path | str, damage: Damage) -> StoreError:
    """Return the error a read or write raises for damage it may not repair."""
    if damage.kind == NEWER_VERSION:
        return StoreError(
            f"journal {path} line {damage.line} was written in format version "
            f"{damage.version!r} by a newer Roder (this one reads up to {FORMAT_VERSION}); "
            "upgrade roder to read this thread; nothing was changed"
        )
    what = {
        "mid_file": "a damaged line with valid records after it",
        "damaged_line": "a complete line that fails its check",
        "sequence": "a sequence number that does not continue the journal",
        "header": "a first line that is not a valid create record",
        "torn_tail": "no complete first line",
        "truncated": "a journal shorter than its index row says",
    }.get(damage.kind, damage.kind)
    return StoreCorruptedError(
        f"journal {path} is damaged at line {damage.line} ({what}: {damage.reason}); "
        "nothing was changed; run `roder fsck --repair` to move the damaged part to a "
        "quarantine file next to the journal",
        thread_id=thread_id,
        path=str(path),
        line=damage.line,
    )


class StoreCore:
    """The state one store object shares between its reader, writer and fsck."""

    def __init__(self, base_path: Path, durability: str, *, read_only: bool = False) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = base_path
        self.durability = durability
        self.threads_dir = base_path / "threads"
        self.tmp_dir = base_path / "tmp"
        self.sessions_dir = base_path / "sessions"
        self.leases_dir = base_path / "leases"
        self.index_path = base_path / "index.sqlite3"
        self._threads_prefix = str(self.threads_dir) + os.sep
        self.index = ThreadIndex(self.index_path)
        self._flushed_at = 0.0
        # A flush of deferred rows waiting out the interval on a store worker (the pool's,
        # no thread of its own), with the pid that started it (a forked child's pool is new).
        self._flush_call: tuple[int, WorkerCall] | None = None
        self._flush_armed = 0  # the pid whose delayed flush has not yet taken the rows
        self._flush_stop = threading.Event()
        self._flush_lock = threading.Lock()
        self.session = WriterMarker(self.sessions_dir)
        self.states: dict[str, JournalState] = {}
        # Damage a read found in a part of a journal the index vouched for, by thread id,
        # with the journal's (inode, size) then: refused until the file changes.
        self.damaged: dict[str, tuple[int, int, StoreError]] = {}
        self._guards: dict[str, threading.Lock] = {}
        self._guards_lock = threading.Lock()
        self.ready_lock = threading.Lock()
        self.ready = False
        self.opened_read_only = read_only
        """True when the store was opened read-only: it writes nothing, whatever it may."""
        self.read_only = read_only
        """True when the store writes nothing (opened so, or may not): the index is in memory."""
        self.session_started = False
        self.index_behind = False

    def journal_path(self, thread_id: str) -> Path:
        """Return the journal file of a thread (validating the id)."""
        return self.threads_dir / (validate_thread_id(thread_id) + JOURNAL_SUFFIX)

    def journal_file(self, thread_id: str) -> str:
        """Return the journal file as a plain string (pathlib costs more than a write)."""
        return f"{self._threads_prefix}{thread_id}{JOURNAL_SUFFIX}"

    def lock_path(self, thread_id: str) -> str:
        """Return the file a thread's writers lock: its journal (see ``_locks``)."""
        return self.journal_file(thread_id)

    def guard(self, thread_id: str) -> threading.Lock:
        """Return the in-process lock of a thread (taken before its writer lock)."""
        with self._guards_lock:
            guard = self._guards.get(thread_id)
            if guard is None:
                guard = self._guards[thread_id] = threading.Lock()
            return guard

    def may_write(self) -> bool:
        """Return True when this process may write the store's directory and its index."""
        if self.opened_read_only:
            return False
        for path in (self.base_path, self.threads_dir, self.index_path):
            if path.exists() and not os.access(path, os.W_OK):
                return False
        return True

    def sync(self, fd: int) -> None:
        """Sync a file per the durability mode."""
        if self.durability != "none":
            datasync(fd)

    def sync_dir(self, path: Path) -> None:
        """Sync a directory per the durability mode."""
        if self.durability != "none":
            fsync_dir(path)

    def row(self, thread_id: str, state: JournalState) -> IndexRow:
        """Return the index row of a journal's state."""
        meta = state.metadata
        return IndexRow(
            thread_id=thread_id,
            updated_at_ms=meta.updated_at_ms,
            inode=state.inode,
            size=state.size,
            lines=state.lines,
            head_crc=state.head_crc,
            boundary_offset=state.boundary_offset,
            boundary_sequence=state.boundary_sequence,
            meta=metadata_json(meta),
            open_turns=len(meta.open_turns),
        )

    def put_rows(self, rows: Iterable[IndexRow]) -> None:
        """Write index rows; a failure leaves the index behind, caught up later."""
        try:
            self.index.put(rows)
        except IndexUnavailable as exc:
            # The journals hold the data; keep our session so the next opener catches up.
            self.index_behind = True
            log.warning("could not update the JSONL index (%s); it will be caught up", exc)

    def known_state(self, thread_id: str, st: os.stat_result) -> JournalState | None:
        """Return the state this store knows of a journal when ``st`` (its ``stat``) shows
        the file as that state left it (the same inode and size) and no damage is
        remembered for it; else None: read the journal."""
        state = self.states.get(thread_id)
        if state is None or not state.describes(st) or thread_id in self.damaged:
            return None
        return state

    def defer_states(self, states: Iterable[tuple[str, JournalState]]) -> None:
        """:meth:`defer_rows` of the rows of these journal states (thread id, state), each
        made only if it is still a thread's newest when the rows are written (a commit's
        state is never changed once stored: the next commit works on a copy)."""
        self.index.defer([_StateRow(self, thread_id, state) for thread_id, state in states])

    def defer_rows(self, rows: Iterable[PendingRow]) -> None:
        """Queue index rows to write later (:meth:`flush_rows`, or before the index is next
        used): for a commit that wakes its callers before it updates the index."""
        self.index.defer(rows)

    def flush_rows(self) -> None:
        """Write the deferred index rows; a failure leaves the index behind, caught up later."""
        try:
            self.index.flush()
        except IndexUnavailable as exc:
            self.index_behind = True
            log.warning("could not update the JSONL index (%s); it will be caught up", exc)

    def flush_rows_soon(self, *, not_now: bool = False) -> None:
        """Write the deferred index rows now, or (when the last write was under
        :data:`INDEX_FLUSH_INTERVAL_S` ago, or ``not_now``) once that interval has passed.

        ``not_now``: for a writer on its caller's path (a create), which should not wait
        for the index; the rows of a burst are written together all the same.
        """
        with self._flush_lock:
            wait = self._flushed_at + INDEX_FLUSH_INTERVAL_S - time.monotonic()
            if not_now:
                wait = max(wait, INDEX_FLUSH_INTERVAL_S)
            if wait > 0 and not self._flush_stop.is_set():
                if self._flush_armed == os.getpid():
                    return  # a delayed flush has yet to take the rows: it writes these too
                call = start_in_worker(self._delayed_flush, wait)
                if call is not None:
                    self._flush_call = (os.getpid(), call)
                    self._flush_armed = os.getpid()
                    return
                # No idle worker to wait on: write them now.
            self._flushed_at = time.monotonic()
        self.flush_rows()

    def _delayed_flush(self, wait: float) -> None:
        self._flush_stop.wait(wait)  # closing cuts it short
        with self._flush_lock:
            self._flush_armed = 0  # rows deferred from now on arm a flush of their own
            self._flushed_at = time.monotonic()
        self.flush_rows()

    def delete_row(self, thread_id: str) -> None:
        """Remove a thread's index row; a failure leaves the index behind."""
        try:
            self.index.delete(thread_id)
        except IndexUnavailable as exc:
            self.index_behind = True
            log.warning("could not update the JSONL index (%s); it will be caught up", exc)

    def journal_files(self) -> dict[str, os.stat_result]:
        """Return ``thread id -> stat`` of every journal file on disk."""
        out: dict[str, os.stat_result] = {}
        try:
            entries = list(os.scandir(self.threads_dir))
        except FileNotFoundError:
            return out
        for entry in entries:
            name = entry.name
            if not name.endswith(JOURNAL_SUFFIX):
                continue
            thread_id = name[: -len(JOURNAL_SUFFIX)]
            try:
                validate_thread_id(thread_id)
                out[thread_id] = entry.stat()
            except (StoreError, FileNotFoundError):
                continue
        return out

    def start_session(self) -> None:
        """Before the first write: make the directories and register a liveness marker."""
        if self.session_started:
            return
        if self.opened_read_only:
            raise StoreError(
                f"the JSONL store in {self.base_path} was opened read-only; open it without "
                "read_only to write; nothing was stored"
            )
        with self.ready_lock:
            if self.session_started:
                return
            try:
                for sub in (self.threads_dir, self.tmp_dir, self.sessions_dir):
                    sub.mkdir(parents=True, exist_ok=True)
                self.session.start(durable=self.durability != "none")
            except OSError as exc:
                # A full, failing or read-only disk before the first write: say so clearly.
                raise StoreError(
                    f"could not start writing to the JSONL store in {self.base_path}: "
                    f"{exc.strerror or exc}; nothing was stored{disk_hint(exc)}"
                ) from exc
            self.session_started = True

    def close(self) -> None:
        """Make the index durable, end the session and close the index."""
        self._flush_stop.set()
        with self._flush_lock:
            pending, self._flush_call = self._flush_call, None
        if pending is not None and pending[0] == os.getpid():
            try:
                pending[1].result()  # cut short by the stop: it writes the rows at once
            except BaseException as exc:  # noqa: BLE001 - logged; close goes on
                log.warning("the delayed JSONL index flush failed (%s)", exc)
        self.flush_rows()
        if self.index.dropped:
            self.index_behind = True  # deferred rows were lost: the next opener catches up
        if self.session_started and not self.index_behind and self.durability != "none":
            # The marker may go only once our rows are durable: a power cut could otherwise
            # lose rows that nothing would tell a later store to rebuild.
            try:
                self.index.make_durable()
            except IndexUnavailable:
                self.index_behind = True
        if self.index_behind:
            self.session.abandon()
        else:
            self.session.end()
        self.index.close()


class _StateRow:
    """A deferred index row: the row of a journal's state, made when it is written, and
    only while the journal is still that state.

    Written after the writer lock is dropped, it may come after another process's row of a
    newer state (that process appended meanwhile and wrote its row at once): replacing it
    would put the index back until the next write. A journal that changed since is left
    to the row of whoever changed it (or, after a crash, to the catch-up).
    """

    __slots__ = ("_core", "_state", "thread_id")

    def __init__(self, core: StoreCore, thread_id: str, state: JournalState) -> None:
        self._core = core
        self.thread_id = thread_id
        self._state = state

    def values(self) -> tuple[Any, ...] | None:
        """Return the row's column values in table order; None when the journal is no
        longer the state the row describes."""
        state = self._state
        try:
            st = os.stat(self._core.journal_file(self.thread_id))
        except OSError:
            return None  # deleted meanwhile: its delete removes the row
        if not state.describes(st):
            return None
        return self._core.row(self.thread_id, state).values()


def quarantine_path(journal: Path) -> Path:
    """Return a new quarantine file name next to ``journal`` (``<journal>.quarantine-<ms>``)."""
    base = journal.with_name(journal.name + QUARANTINE_INFIX + str(now_ms()))
    candidate, n = base, 0
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def quarantine_tail(path: Path, quarantine: Path, offset: int) -> int:
    """Copy the journal from ``offset`` into ``quarantine`` (synced), then cut it there.

    Never loses a byte: the copy and its directory entry are durable before the cut.
    """
    moved = 0
    with open(path, "rb") as source, open(quarantine, "xb") as target:
        source.seek(offset)
        while True:
            chunk = source.read(1 << 20)
            if not chunk:
                break
            target.write(chunk)
            moved += len(chunk)
        target.flush()
        os.fsync(target.fileno())
    fsync_dir(path.parent)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return moved
