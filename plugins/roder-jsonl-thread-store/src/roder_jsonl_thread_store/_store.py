"""The JSONL thread store: one append-only, checksummed journal file per thread.

Layout under ``base_path``::

    threads/<thread id>.jsonl   the journals (the truth)
    index.sqlite3               the listing index (a cache of every journal's state)
    locks/<thread id>.lock      one writer lock per thread (flock, across processes)
    leases/<thread id>.lease    one session lease per thread (flock, holder JSON inside)
    sessions/*.session          liveness markers of stores that write (see below)
    tmp/                        new journals before they are linked into place

Writing a batch: take the thread's lock (in this process, then across processes), bring the
known state up to the journal's end (cutting a torn tail a dead writer left), append the
batch's line(s) with one ``write``, sync per the durability mode, update the index row,
release. ``group`` durability gathers the commits that arrive while a sync is in flight (to
one thread or many) and writes and syncs them together.

The index can fall behind a journal only when a process dies between the journal write and
the index update. Every store that writes holds a locked session marker; a marker whose lock
can be taken belongs to a dead process, and whoever finds one (on open, and before each
listing) catches the index up from the journals before removing it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import anyio
import anyio.to_thread
import orjson

from roder_api._record import to_dict
from roder_api.codec import (
    EXACT_MARK,
    check_value,
    dumps_each,
    dumps_json,
    dumps_list,
    from_dict,
    loads_json,
)
from roder_api.errors import (
    SequenceConflictError,
    StoppedError,
    StoreCorruptedError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
)
from roder_api.events import Event, ItemCompleted, JournalEvent, UsageUpdated, is_boundary_event
from roder_api.inference import TokenUsage
from roder_api.storekit import FileLeases, GroupCommit
from roder_api.threads import (
    UNSET,
    EventPage,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadStore,
    ThreadStoreFactory,
    check_consecutive,
    decode_cursor,
    encode_cursor,
    metadata_changes,
    validate_thread_id,
)
from roder_jsonl_thread_store._format import (
    FORMAT_VERSION,
    encode_record,
    events_record,
)
from roder_jsonl_thread_store._index import IndexRow, IndexUnavailable, ThreadIndex
from roder_jsonl_thread_store._journal import (
    NEWER_VERSION,
    UNTERMINATED,
    Damage,
    JournalState,
    line_crc,
    scan,
)
from roder_jsonl_thread_store._locks import (
    HAVE_FLOCK,
    ProcessLock,
    WriterMarker,
    bury,
    dead_sessions,
)

log = logging.getLogger("roder.jsonl")

DURABILITY_MODES = ("fsync", "group", "none")
"""``fsync``: each commit synced before it returns; ``group``: concurrent commits share one
sync, each still durable before it returns; ``none``: handed to the OS only."""

JOURNAL_SUFFIX = ".jsonl"
QUARANTINE_INFIX = ".quarantine-"

SYNC_WORKERS = 8
"""Threads that sync the journals of one group commit in parallel. On ext4 here, 32 journals
synced from 4 threads took half the time of syncing them one after the other; more threads
were slower again (the journal commits serialise)."""

_TAIL = b"}\n"

T = TypeVar("T")

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _journal_event_builder() -> Callable[[int, int, Any], JournalEvent]:
    """Return a fast ``JournalEvent(sequence, recorded_at_ms, event)`` for the read path.

    Fills the slots directly, as the dataclass's ``__init__`` would; loading a long thread
    builds one per event, and this halves its cost.
    """
    try:
        new = object.__new__
        set_sequence = JournalEvent.__dict__["sequence"].__set__
        set_time = JournalEvent.__dict__["recorded_at_ms"].__set__
        set_event = JournalEvent.__dict__["event"].__set__
        set_unknown = next(
            k.__dict__["unknown_fields"].__set__
            for k in JournalEvent.__mro__
            if "unknown_fields" in k.__dict__
        )
    except (KeyError, AttributeError, StopIteration):  # pragma: no cover - not slotted
        return JournalEvent

    def build(sequence: int, recorded_at_ms: int, event: Any) -> JournalEvent:
        entry: JournalEvent = new(JournalEvent)
        set_sequence(entry, sequence)
        set_time(entry, recorded_at_ms)
        set_event(entry, event)
        set_unknown(entry, {})
        return entry

    return build


_journal_event = _journal_event_builder()


# --- reports of fsck ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThreadCheck:
    """What checking one journal found.

    ``damage`` is the first problem in the journal (None: every line is good);
    ``index`` says whether the listing index agrees: ``ok``, ``missing``, ``behind`` or
    ``disagrees``.
    """

    thread_id: str
    path: Path
    size: int
    lines: int
    last_sequence: int
    damage: Damage | None
    index: str

    @property
    def ok(self) -> bool:
        """Return True when the journal is intact and the index agrees with it."""
        return self.damage is None and self.index == "ok"

    def describe(self) -> str:
        """Return one line saying what is wrong (or ``ok``)."""
        parts = []
        if self.damage is not None:
            parts.append(
                f"line {self.damage.line} (byte {self.damage.offset}): {self.damage.kind}: "
                f"{self.damage.reason}"
            )
        if self.index != "ok":
            parts.append(f"index {self.index}")
        return "; ".join(parts) or "ok"

    def to_json(self) -> dict[str, Any]:
        """Return the check as plain JSON data."""
        damage = None
        if self.damage is not None:
            damage = {
                "line": self.damage.line,
                "offset": self.damage.offset,
                "kind": self.damage.kind,
                "reason": self.damage.reason,
            }
        return {
            "thread_id": self.thread_id,
            "path": str(self.path),
            "size": self.size,
            "lines": self.lines,
            "last_sequence": self.last_sequence,
            "damage": damage,
            "index": self.index,
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True)
class ThreadRepair:
    """What repairing one journal did.

    ``quarantine`` is the file the damaged tail was moved to (None: nothing moved);
    ``unrepaired`` says why damage was left in place (a newer format version).
    """

    thread_id: str
    quarantine: Path | None = None
    bytes_moved: int = 0
    newline_added: bool = False
    journal_removed: bool = False
    index_fixed: bool = False
    unrepaired: str | None = None

    @property
    def changed(self) -> bool:
        """Return True when the repair changed the journal or the index."""
        return bool(self.quarantine or self.newline_added or self.index_fixed)

    def to_json(self) -> dict[str, Any]:
        """Return the repair as plain JSON data."""
        return {
            "thread_id": self.thread_id,
            "quarantine": str(self.quarantine) if self.quarantine else None,
            "bytes_moved": self.bytes_moved,
            "newline_added": self.newline_added,
            "journal_removed": self.journal_removed,
            "index_fixed": self.index_fixed,
            "unrepaired": self.unrepaired,
        }


# --- commits --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Commit:
    """One call's worth of lines for one thread, with its outcome."""

    thread_id: str
    build: Callable[[JournalState], bytes]
    result: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Held:
    """A thread locked for a batch, with what is being written to it."""

    thread_id: str
    guard: threading.Lock
    lock: ProcessLock
    commits: list[_Commit]
    fd: int | None = None
    before: JournalState | None = None
    after: JournalState | None = None
    data: bytes = b""
    error: BaseException | None = None


def _advance(state: JournalState, line: bytes, entries: Sequence[JournalEvent]) -> None:
    """Fold one appended events line into ``state`` (in place)."""
    offset = state.size
    meta = state.metadata
    usage = meta.usage
    items = meta.item_count
    updated = meta.updated_at_ms
    for entry in entries:
        event = entry.event
        if isinstance(event, UsageUpdated):
            usage = usage + event.usage
        elif isinstance(event, ItemCompleted):
            items += 1
            if is_boundary_event(event):
                state.boundary_offset = offset
                state.boundary_sequence = entry.sequence
        if entry.recorded_at_ms > updated:
            updated = entry.recorded_at_ms
    if entries:
        # What fold_metadata computes, built directly: dataclasses.replace costs more than
        # the rest of a commit's bookkeeping.
        state.metadata = ThreadMetadata(
            thread_id=meta.thread_id,
            created_at_ms=meta.created_at_ms,
            updated_at_ms=updated,
            title=meta.title,
            usage=usage,
            item_count=items,
            last_sequence=entries[-1].sequence,
            extra=meta.extra,
            unknown_fields=meta.unknown_fields,
        )
    state.size += len(line)
    state.lines += 1


def _copy(state: JournalState) -> JournalState:
    return JournalState(
        state.inode,
        state.size,
        state.lines,
        state.head_crc,
        state.metadata,
        state.boundary_offset,
        state.boundary_sequence,
    )


def _one_event_list(payload: bytes) -> bytes:
    """Return the JSON list of one event's codec bytes, keeping the codec's exact mark first."""
    if payload[:1] == EXACT_MARK:
        return b"%s[%s]" % (EXACT_MARK, payload)
    return b"[%s]" % payload


def _metadata_json(meta: ThreadMetadata) -> bytes:
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
            },
            "item_count": meta.item_count,
            "last_sequence": meta.last_sequence,
            "extra": meta.extra,
        }
    )


class JsonlThreadStore(ThreadStore):
    """A thread store of one ``<thread id>.jsonl`` journal per thread under ``base_path``.

    Each committed batch is one line written with one ``write`` and synced per the
    durability mode. Writers to one thread are serialised in this process and across
    processes (a lock file per thread; the OS releases the lock of a process that dies). A
    torn last line is cut away when the journal is next opened; damage followed by valid
    lines is refused with ``StoreCorruptedError`` and left for ``roder fsck --repair``.

    A store object belongs to one event loop (group commit waits on anyio events); open one
    store per event loop or process.
    """

    def __init__(self, base_path: Path, *, durability: str = "fsync") -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = base_path
        self.durability = durability
        self.threads_dir = base_path / "threads"
        self.locks_dir = base_path / "locks"
        self.tmp_dir = base_path / "tmp"
        self.sessions_dir = base_path / "sessions"
        self.index_path = base_path / "index.sqlite3"
        self.leases_dir = base_path / "leases"
        self._leases = FileLeases(self.leases_dir)
        self._threads_prefix = str(self.threads_dir) + os.sep
        self._locks_prefix = str(self.locks_dir) + os.sep
        self._index = ThreadIndex(self.index_path)
        self._session = WriterMarker(self.sessions_dir)
        self._states: dict[str, JournalState] = {}
        # Damage a read found in a part of a journal the index vouched for, by thread id,
        # with the journal's (inode, size) then: refused until the file changes.
        self._damaged: dict[str, tuple[int, int, StoreError]] = {}
        self._guards: dict[str, threading.Lock] = {}
        self._guards_lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._ready = False
        self._session_started = False
        self._index_behind = False
        self._closed = False
        self._group: GroupCommit[_Commit, Any] = GroupCommit(self._commit_sync)
        self._pool: ThreadPoolExecutor | None = None
        # A test seam for crash tests: called after a journal write is synced and before the
        # index is updated (a real child process SIGKILLs itself here).
        self._after_journal_write: Callable[[str], None] | None = None

    # --- helpers --------------------------------------------------------------------------

    def journal_path(self, thread_id: str) -> Path:
        """Return the journal file of a thread (validating the id)."""
        return self.threads_dir / (validate_thread_id(thread_id) + JOURNAL_SUFFIX)

    def _journal_file(self, thread_id: str) -> str:
        # A plain string, joined once per call: pathlib costs more than the write itself.
        return f"{self._threads_prefix}{thread_id}{JOURNAL_SUFFIX}"

    def _lock_path(self, thread_id: str) -> str:
        return f"{self._locks_prefix}{thread_id}.lock"

    def _guard(self, thread_id: str) -> threading.Lock:
        with self._guards_lock:
            guard = self._guards.get(thread_id)
            if guard is None:
                guard = self._guards[thread_id] = threading.Lock()
            return guard

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoppedError("the JSONL thread store is closed; open a new one")
        return await anyio.to_thread.run_sync(func, *args)

    def _sync(self, fd: int) -> None:
        if self.durability != "none":
            _datasync(fd)

    def _sync_dir(self, path: Path) -> None:
        if self.durability != "none":
            _fsync_dir(path)

    # --- the index and its catch-up -------------------------------------------------------

    def _ensure_ready(self) -> None:
        """Open the index on first use, rebuilding it or catching it up when needed."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            for sub in (self.threads_dir, self.locks_dir, self.tmp_dir, self.sessions_dir):
                sub.mkdir(parents=True, exist_ok=True)
            try:
                self._index.open()
            except IndexUnavailable as exc:
                self._set_index_aside(str(exc))
                self._index.open()
            if self._index.created:
                self._catch_up()
            else:
                self._check_sessions(force=not HAVE_FLOCK)
            self._ready = True

    def _set_index_aside(self, why: str) -> None:
        self._index.close()
        aside = self.index_path.with_name(f"index.sqlite3.bad-{_now_ms()}")
        log.warning("the JSONL index %s is unusable (%s); rebuilding it", self.index_path, why)
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.index_path) + suffix)
            if source.exists():
                os.replace(source, Path(str(aside) + suffix))

    def _check_sessions(self, *, force: bool = False) -> None:
        """Catch the index up when a writer died since it was last checked."""
        dead = dead_sessions(self.sessions_dir, self._session.path)
        if dead or force:
            if dead:
                log.info("a writer of %s died; catching the index up", self.base_path)
            try:
                self._catch_up()
            except BaseException:
                # Keep the markers: whoever looks next catches up again.
                for _path, fd in dead:
                    os.close(fd)
                raise
            bury(dead)

    def _journal_files(self) -> dict[str, os.stat_result]:
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

    def _catch_up(self, progress: Callable[[str], None] | None = None) -> int:
        """Bring every index row up to its journal; return how many rows changed."""
        rows = self._index.sizes()
        files = self._journal_files()
        changed = 0
        for thread_id, st in files.items():
            known = rows.get(thread_id)
            if known is not None and known[0] == st.st_ino and known[1] == st.st_size:
                if progress:
                    progress(thread_id)
                continue
            try:
                self._refresh_locked(thread_id, force_index=True)
                changed += 1
            except ThreadNotFoundError:
                pass
            except StoreError as exc:
                log.warning("cannot index thread %s: %s", thread_id, exc)
            if progress:
                progress(thread_id)
        for thread_id in rows.keys() - files.keys():
            with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
                if not self.journal_path(thread_id).exists():
                    self._delete_row(thread_id)
                    self._states.pop(thread_id, None)
                    changed += 1
        return changed

    def _row(self, thread_id: str, state: JournalState) -> IndexRow:
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
            meta=_metadata_json(meta),
        )

    def _put_rows(self, rows: Iterable[IndexRow]) -> None:
        try:
            self._index.put(rows)
        except IndexUnavailable as exc:
            # The journals hold the data; keep our session so the next opener catches up.
            self._index_behind = True
            log.warning("could not update the JSONL index (%s); it will be caught up", exc)

    def _delete_row(self, thread_id: str) -> None:
        self._index.delete(thread_id)

    def _start_session(self) -> None:
        if not self._session_started:
            with self._ready_lock:
                if not self._session_started:
                    try:
                        self._session.start(durable=self.durability != "none")
                    except OSError as exc:
                        # A full or failing disk before the first write: say so clearly.
                        hint = "; free disk space and retry" if exc.errno == errno.ENOSPC else ""
                        raise StoreError(
                            f"could not start writing to the JSONL store in {self.base_path}: "
                            f"{exc.strerror or exc}; nothing was stored{hint}"
                        ) from exc
                    self._session_started = True

    # --- loading a journal's state --------------------------------------------------------

    def _state(self, thread_id: str) -> JournalState:
        """Return the thread's state up to its journal's end (repairing a torn tail)."""
        self._ensure_ready()
        with self._guard(thread_id):
            state = self._load_state(thread_id, locked=False)
        if state is not None:
            return state
        # A torn tail: a writer is mid-write, or one died there. Under its lock we know which.
        return self._refresh_locked(thread_id)

    def _refresh_locked(self, thread_id: str, *, force_index: bool = False) -> JournalState:
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            state = self._load_state(thread_id, locked=True, force_index=force_index)
            assert state is not None  # locked loads repair or raise
            return state

    def _base_state(
        self, thread_id: str, file: BinaryIO, st: os.stat_result
    ) -> JournalState | None:
        """Return a known state that the journal extends (cached or from the index)."""
        cached = self._states.get(thread_id)
        if cached is not None and cached.inode == st.st_ino and cached.size <= st.st_size:
            return cached
        try:
            row = self._index.get(thread_id)
        except IndexUnavailable:
            row = None
        if row is None or row.inode != st.st_ino or row.size > st.st_size:
            return None
        head = file.read(20)
        if line_crc(head) != row.head_crc:
            return None
        meta = from_dict(loads_json(row.meta))
        return JournalState(
            inode=row.inode,
            size=row.size,
            lines=row.lines,
            head_crc=row.head_crc,
            metadata=meta,
            boundary_offset=row.boundary_offset,
            boundary_sequence=row.boundary_sequence,
        )

    def _load_state(
        self, thread_id: str, *, locked: bool, force_index: bool = False
    ) -> JournalState | None:
        """Scan what the journal holds beyond the known state. Hold the thread's guard.

        Returns None for a torn tail when not ``locked`` (the caller retries locked); with
        the writer lock held, cuts it (or adds a missing newline) first. Raises
        ``StoreCorruptedError`` for damage that is not safe to cut.
        """
        path = self.journal_path(thread_id)
        try:
            file = open(path, "rb")
        except FileNotFoundError:
            self._states.pop(thread_id, None)
            raise ThreadNotFoundError(thread_id) from None
        with file:
            st = os.fstat(file.fileno())
            known = self._damaged.get(thread_id)
            if known is not None:
                if (known[0], known[1]) == (st.st_ino, st.st_size):
                    raise known[2]
                del self._damaged[thread_id]
                self._states.pop(thread_id, None)
                base = None
            else:
                base = self._base_state(thread_id, file, st)
            if base is not None and base.size == st.st_size:
                self._states[thread_id] = base
                if force_index:
                    self._put_rows([self._row(thread_id, base)])
                return base
            result = scan(file, st.st_ino, base, thread_id=thread_id)
            if result.damage is not None and base is not None:
                # Judge damage from the first line, never from a remembered offset: a repair
                # elsewhere may have cut the journal below it and written it again.
                result = scan(file, st.st_ino, None, thread_id=thread_id)
        damage = result.damage
        if damage is not None:
            self._states.pop(thread_id, None)
            if not damage.automatic:
                raise self._damage_error(thread_id, path, damage)
            if not locked:
                return None
            self._repair_tail(thread_id, path, damage, result.state, result.file_size)
            return self._load_state(thread_id, locked=True, force_index=True)
        state = result.state
        if state is None:
            raise StoreCorruptedError(
                f"journal {path} is empty; run `roder fsck --repair` to set it aside",
                thread_id=thread_id,
                path=str(path),
                line=1,
            )
        self._states[thread_id] = state
        if locked or force_index:
            self._put_rows([self._row(thread_id, state)])
        return state

    def _damage_error(self, thread_id: str, path: Path, damage: Damage) -> StoreError:
        if damage.kind == NEWER_VERSION:
            return StoreError(
                f"journal {path} line {damage.line} was written in format version "
                f"{damage.version!r} by a newer Roder (this one reads up to {FORMAT_VERSION}); "
                "upgrade roder to read this thread; nothing was changed"
            )
        what = {
            "mid_file": "a damaged line with valid records after it",
            "sequence": "a sequence number that does not continue the journal",
            "header": "a first line that is not a valid create record",
        }.get(damage.kind, damage.kind)
        return StoreCorruptedError(
            f"journal {path} is damaged at line {damage.line} ({what}: {damage.reason}); "
            "nothing was changed; run `roder fsck --repair` to move the damaged part to a "
            "quarantine file next to the journal",
            thread_id=thread_id,
            path=str(path),
            line=damage.line,
        )

    def _repair_tail(
        self,
        thread_id: str,
        path: Path,
        damage: Damage,
        state: JournalState | None,
        file_size: int,
    ) -> None:
        """Fix a crash mid-write: add a missing newline or cut a torn tail (lock held)."""
        if damage.kind == UNTERMINATED:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                _write_all(fd, b"\n")
                self._sync(fd)
            finally:
                os.close(fd)
            log.warning("journal %s: added the missing newline of line %d", path, damage.line)
            return
        if state is None:
            raise StoreCorruptedError(
                f"journal {path} has no complete first line; run `roder fsck --repair` to set "
                "it aside",
                thread_id=thread_id,
                path=str(path),
                line=1,
            )
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, damage.offset)
            self._sync(fd)
        finally:
            os.close(fd)
        log.warning(
            "journal %s: cut a torn last line %d (%d bytes removed)",
            path,
            damage.line,
            file_size - damage.offset,
        )

    # --- writing --------------------------------------------------------------------------

    def _commit_sync(self, batch: list[_Commit]) -> list[Any]:
        """Write and sync a batch of commits (to one thread or many) under their locks.

        Returns each commit's outcome, in order: its result, or the exception to raise.
        """
        self._ensure_ready()
        self._start_session()
        by_thread: dict[str, list[_Commit]] = {}
        for commit in batch:
            by_thread.setdefault(commit.thread_id, []).append(commit)
        held: list[_Held] = []
        pending: list[Future[None]] = []
        many = len(by_thread) > 1 and self.durability != "none"
        if many and self._pool is None:
            self._pool = ThreadPoolExecutor(SYNC_WORKERS, thread_name_prefix="roder-jsonl-sync")
        try:
            # Sorted, so that two processes locking several threads never deadlock.
            for thread_id in sorted(by_thread):
                guard = self._guard(thread_id)
                guard.acquire()
                lock = ProcessLock(self._lock_path(thread_id))
                try:
                    lock.__enter__()
                except BaseException:
                    guard.release()
                    raise
                entry = _Held(thread_id, guard, lock, by_thread[thread_id])
                held.append(entry)
                self._prepare_write(entry)
                if many and entry.data and entry.error is None:
                    # Sync this journal while the next ones are written.
                    assert self._pool is not None
                    pending.append(self._pool.submit(self._sync_entry, entry))
            writing = [e for e in held if e.data and e.error is None]
            if many:
                for future in pending:
                    future.result()
            elif writing and self.durability != "none":
                self._sync_entry(writing[0])
            rows = []
            for entry in writing:
                if entry.error is not None:
                    continue
                assert entry.after is not None
                self._states[entry.thread_id] = entry.after
                if self._after_journal_write is not None:
                    self._after_journal_write(entry.thread_id)
                rows.append(self._row(entry.thread_id, entry.after))
            self._put_rows(rows)
        finally:
            for future in pending:
                future.exception()  # never release a lock while its journal is syncing
            for entry in reversed(held):
                try:
                    if entry.fd is not None:
                        os.close(entry.fd)
                finally:
                    entry.lock.__exit__(None, None, None)
                    entry.guard.release()
        for entry in held:
            for commit in entry.commits:
                if entry.error is not None and commit.error is None:
                    commit.error = entry.error
        return [commit.error if commit.error is not None else commit.result for commit in batch]

    def _prepare_write(self, entry: _Held) -> None:
        """Bring the thread's state to the journal's end and write its commits (unsynced)."""
        thread_id = entry.thread_id
        try:
            try:
                entry.fd = os.open(self._journal_file(thread_id), os.O_WRONLY | os.O_APPEND)
            except FileNotFoundError:
                self._states.pop(thread_id, None)
                raise ThreadNotFoundError(thread_id) from None
            st = os.fstat(entry.fd)
            cached = self._states.get(thread_id)
            if (
                cached is not None
                and cached.inode == st.st_ino
                and cached.size == st.st_size
                and thread_id not in self._damaged
            ):
                state: JournalState | None = cached
            else:
                state = self._load_state(thread_id, locked=True)
            assert state is not None  # locked loads repair or raise
            work = _copy(state)
            chunks = []
            for commit in entry.commits:
                try:
                    chunks.append(commit.build(work))
                except (SequenceConflictError, UnserializableEventError) as exc:
                    commit.error = exc
            entry.before, entry.after, entry.data = state, work, b"".join(chunks)
            if not entry.data:
                return
            try:
                _write_all(entry.fd, entry.data)
            except OSError as exc:
                self._undo(entry, exc)
        except OSError as exc:
            entry.error = StoreError(
                f"could not open the journal of {thread_id!r}: {exc.strerror or exc}"
            )
        except BaseException as exc:
            entry.error = exc

    def _sync_entry(self, entry: _Held) -> None:
        assert entry.fd is not None
        try:
            _datasync(entry.fd)
        except OSError as exc:
            self._undo(entry, exc)

    def _undo(self, entry: _Held, exc: OSError) -> None:
        """Leave no partial batch behind after a failed write or sync."""
        assert entry.before is not None
        self._states.pop(entry.thread_id, None)
        if entry.fd is not None:
            try:
                os.ftruncate(entry.fd, entry.before.size)
            except OSError:
                pass  # the next writer cuts the torn tail anyway
        hint = "; free disk space and retry" if exc.errno == errno.ENOSPC else ""
        entry.error = StoreError(
            f"could not append to {self.journal_path(entry.thread_id)}: "
            f"{exc.strerror or exc}; nothing of this batch was stored{hint}"
        )

    async def _submit(self, commit: _Commit) -> Any:
        if self._closed:
            raise StoppedError("the JSONL thread store is closed; open a new one")
        if self.durability == "group":
            return await self._group.submit(commit)
        outcome = (await anyio.to_thread.run_sync(self._commit_sync, [commit]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _events_commit(
        self,
        thread_id: str,
        events_json: bytes,
        events: Sequence[Event],
        expected_last_sequence: int | None = None,
    ) -> _Commit:
        commit = _Commit(thread_id, lambda state: b"")

        def build(state: JournalState) -> bytes:
            # Called with the thread's writer lock held (in this process and across
            # processes): nothing can append between this check and the write.
            last = state.metadata.last_sequence
            if expected_last_sequence is not None and last != expected_last_sequence:
                raise SequenceConflictError.conditional(thread_id, expected_last_sequence, last)
            first = last + 1
            now = _now_ms()
            line = events_record(first, now, events_json)
            entries = [JournalEvent(first + i, now, e) for i, e in enumerate(events)]
            _advance(state, line, entries)
            commit.result = entries
            return line

        commit.build = build
        return commit

    def _import_commit(
        self, thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> _Commit:
        def build(state: JournalState) -> bytes:
            expected = state.metadata.last_sequence + 1
            if entries[0].sequence != expected:
                raise SequenceConflictError(thread_id, expected, entries[0].sequence)
            # One line per imported event keeps each event's own recorded time.
            lines = [
                events_record(entry.sequence, entry.recorded_at_ms, _one_event_list(payload))
                for entry, payload in zip(entries, payloads, strict=True)
            ]
            for line, entry in zip(lines, entries, strict=True):
                _advance(state, line, [entry])
            return b"".join(lines)

        return _Commit(thread_id, build)

    def _meta_commit(self, thread_id: str, changes: dict[str, Any]) -> _Commit:
        commit = _Commit(thread_id, lambda state: b"")

        def build(state: JournalState) -> bytes:
            now = _now_ms()
            line = encode_record({"v": FORMAT_VERSION, "k": "meta", "t": now, **changes})
            # As a scan folds it: the update time never goes back.
            updates: dict[str, Any] = {"updated_at_ms": max(now, state.metadata.updated_at_ms)}
            if "title" in changes:
                updates["title"] = changes["title"]
            if "extra" in changes:
                updates["extra"] = changes["extra"]
            state.metadata = replace(state.metadata, **updates)
            state.size += len(line)
            state.lines += 1
            commit.result = state.metadata
            return line

        commit.build = build
        return commit

    def _create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        self._ensure_ready()
        self._start_session()
        thread_id = metadata.thread_id
        path = self.journal_path(thread_id)
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0)
        check_value(stored, what="the thread's metadata")
        line = encode_record({"v": FORMAT_VERSION, "k": "create", "meta": to_dict(stored)})
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            if path.exists():
                raise ThreadExistsError(thread_id)
            tmp = self.tmp_dir / f"{thread_id}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    _write_all(fd, line)
                    self._sync(fd)
                finally:
                    os.close(fd)
                # link() is atomic and refuses to replace: a journal always has its header.
                os.link(tmp, path)
            except FileExistsError:
                raise ThreadExistsError(thread_id) from None
            except OSError as exc:
                # A full or failing disk: no journal was made; say so as a StoreError.
                hint = "; free disk space and retry" if exc.errno == errno.ENOSPC else ""
                raise StoreError(
                    f"could not create thread {thread_id!r} in {self.threads_dir}: "
                    f"{exc.strerror or exc}; nothing was stored{hint}"
                ) from exc
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            self._sync_dir(self.threads_dir)
            self._states.pop(thread_id, None)
            state = self._load_state(thread_id, locked=True)
            assert state is not None  # locked loads repair or raise
            return state.metadata

    def _delete_sync(self, thread_id: str) -> None:
        self._ensure_ready()
        self._start_session()
        path = self.journal_path(thread_id)
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            finally:
                self._states.pop(thread_id, None)
            self._sync_dir(self.threads_dir)
            try:
                self._delete_row(thread_id)
            except IndexUnavailable as exc:
                self._index_behind = True
                log.warning("could not update the JSONL index (%s); it will be caught up", exc)

    # --- reading --------------------------------------------------------------------------

    def _metadata_sync(self, thread_id: str) -> ThreadMetadata:
        return self._state(thread_id).metadata

    def _seek_sequence(self, file: BinaryIO, state: JournalState, target: int) -> int:
        """Return a line offset at or before the line holding sequence ``target``.

        A binary search over byte offsets (sequences grow with the offset), then the reader
        skips forward: the cost grows with the log of the journal's length.
        """
        lo, hi = 0, state.size
        while hi - lo > 16384:
            mid = (lo + hi) // 2
            file.seek(mid)
            start = mid + len(file.readline())
            found: int | None = None
            while start < hi:
                raw = file.readline()
                if not raw:
                    break
                try:
                    record = loads_json(raw[20:-2])
                    if record.get("k") == "events":
                        found = int(record["seq"])
                        break
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    break
                start += len(raw)
            if found is not None and start < hi and found <= target:
                lo = start
            else:
                hi = mid
        return lo

    def _read_sync(
        self,
        thread_id: str,
        after: int,
        before: int | None,
        limit: int | None,
        mode: str,
    ) -> list[JournalEvent]:
        """Return events with ``after < sequence < before`` (``mode``: replay or seek)."""
        path = self.journal_path(thread_id)
        try:
            file = open(self._journal_file(thread_id), "rb")
        except FileNotFoundError:
            with self._guard(thread_id):
                self._states.pop(thread_id, None)
            raise ThreadNotFoundError(thread_id) from None
        with file:
            st = os.fstat(file.fileno())
            state = self._states.get(thread_id)
            if (
                state is None
                or state.inode != st.st_ino
                or state.size != st.st_size
                or thread_id in self._damaged
            ):
                state = self._state(thread_id)
            if after >= state.metadata.last_sequence:
                return []
            offset = 0
            if mode == "replay":
                offset = state.boundary_offset
                after = max(after, state.boundary_sequence - 1)
            elif after > 0:
                offset = self._seek_sequence(file, state, after + 1)
            return self._read_from(file, path, thread_id, state, offset, after, before, limit)

    def _read_from(
        self,
        file: BinaryIO,
        path: Path,
        thread_id: str,
        state: JournalState,
        offset: int,
        after: int,
        before: int | None,
        limit: int | None,
    ) -> list[JournalEvent]:
        out: list[JournalEvent] = []
        append = out.append
        loads = loads_json
        crc32 = zlib.crc32
        decode = from_dict
        make = _journal_event
        end = state.size
        stop = before if before is not None else state.metadata.last_sequence + 1
        room = limit if limit is not None else state.metadata.last_sequence + 1
        position = offset
        number = 0
        file.seek(offset)
        for raw in file:
            position += len(raw)
            number += 1
            if position > end:
                break
            try:
                # A line cut short or with a damaged checksum field fails the hex parse or
                # the checksum; fsck also compares the frame byte for byte.
                body = raw[20:-2]
                if crc32(body) != int(raw[6:14], 16) or raw[-2:] != _TAIL:
                    raise ValueError("bad framing or checksum mismatch")
                record = loads(body)
                if record["v"] > FORMAT_VERSION:
                    raise StoreError(
                        f"journal {path} holds format version {record['v']!r} from a newer "
                        f"Roder (this one reads up to {FORMAT_VERSION}); upgrade roder"
                    )
                if record["k"] != "events":
                    continue
                seq = record["seq"]
                events = record["events"]
                count = len(events)
                if seq > after and seq + count <= stop and count <= room:
                    # The common case: the whole line is wanted.
                    t = record["t"]
                    if count == 1:
                        append(make(seq, t, decode(events[0])))
                    else:
                        for index, event in enumerate(events):
                            append(make(seq + index, t, decode(event)))
                    room -= count
                    if room == 0:
                        return out
                    continue
                if seq + count <= after + 1:
                    continue
                if seq >= stop:
                    break
                t = record["t"]
                for index, event in enumerate(events):
                    sequence = seq + index
                    if sequence <= after:
                        continue
                    if sequence >= stop:
                        return out
                    append(make(sequence, t, decode(event)))
                    room -= 1
                    if room == 0:
                        return out
            except (ValueError, KeyError, TypeError) as exc:
                where = f"line {number}" if offset == 0 else f"byte {position - len(raw)}"
                error = StoreCorruptedError(
                    f"journal {path} is damaged at {where} ({exc}); nothing was changed; run "
                    "`roder fsck --repair` to move the damaged part to a quarantine file",
                    thread_id=thread_id,
                    path=str(path),
                    line=number if offset == 0 else None,
                )
                with self._guard(thread_id):
                    self._states.pop(thread_id, None)
                    self._damaged[thread_id] = (state.inode, os.fstat(file.fileno()).st_size, error)
                raise error from None
        return out

    def _page_sync(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        state = self._state(thread_id)
        last = state.metadata.last_sequence
        if before is None or before > last + 1:
            before = last + 1
        if before <= 1:
            return EventPage((), None)
        first = max(1, before - limit)
        events = self._read_sync(thread_id, first - 1, before, limit, "seek")
        return EventPage(tuple(events), first if first > 1 else None)

    def _list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        position = decode_cursor(cursor) if cursor else None
        self._ensure_ready()
        self._check_sessions(force=not HAVE_FLOCK)
        try:
            rows = self._index.page(position, limit + 1)
        except IndexUnavailable as exc:
            with self._ready_lock:
                self._set_index_aside(str(exc))
                self._index.open()
                self._catch_up()
            rows = self._index.page(position, limit + 1)
        metas = [from_dict(loads_json(row.meta)) for row in rows[:limit]]
        more = len(rows) > limit
        last = metas[-1] if metas else None
        next_cursor = encode_cursor(last.updated_at_ms, last.thread_id) if more and last else None
        return ThreadPage(tuple(metas), next_cursor)

    # --- checking and repairing (roder fsck) ----------------------------------------------

    def _journal_ids_sync(self) -> list[str]:
        self._ensure_ready()
        return sorted(self._journal_files())

    def _check_sync(self, thread_id: str) -> ThreadCheck:
        self._ensure_ready()
        path = self.journal_path(thread_id)
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            try:
                file = open(path, "rb")
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            with file:
                st = os.fstat(file.fileno())
                result = scan(file, st.st_ino, None, thread_id=thread_id, full_check=True)
            try:
                row = self._index.get(thread_id)
            except IndexUnavailable:
                row = None
        state = result.state
        if row is None:
            index = "missing"
        elif state is None:
            index = "disagrees"
        elif self._row(thread_id, state) == row:
            index = "ok"
        elif row.inode == state.inode and row.size < state.size:
            index = "behind"
        else:
            index = "disagrees"
        if state is None and result.damage is None:
            result = replace(result, damage=Damage(0, 1, "header", "the journal is empty"))
        return ThreadCheck(
            thread_id=thread_id,
            path=path,
            size=result.file_size,
            lines=state.lines if state else 0,
            last_sequence=state.metadata.last_sequence if state else 0,
            damage=result.damage,
            index=index,
        )

    def _repair_sync(self, thread_id: str) -> ThreadRepair:
        self._ensure_ready()
        self._start_session()
        path = self.journal_path(thread_id)
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            try:
                file = open(path, "rb")
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            with file:
                st = os.fstat(file.fileno())
                result = scan(file, st.st_ino, None, thread_id=thread_id)
            self._states.pop(thread_id, None)
            damage = result.damage
            repair = ThreadRepair(thread_id)
            if damage is not None and damage.kind == NEWER_VERSION:
                return replace(
                    repair,
                    unrepaired=f"line {damage.line} is from a newer Roder; upgrade roder",
                )
            if damage is not None and damage.kind == UNTERMINATED:
                self._repair_tail(thread_id, path, damage, result.state, result.file_size)
                repair = replace(repair, newline_added=True)
            elif damage is not None:
                quarantine = path.with_name(path.name + QUARANTINE_INFIX + str(_now_ms()))
                if result.state is None or damage.offset == 0:
                    os.rename(path, quarantine)
                    self._sync_dir(self.threads_dir)
                    try:
                        self._delete_row(thread_id)
                    except IndexUnavailable:
                        self._index_behind = True
                    log.warning("journal %s: moved to %s (no valid first line)", path, quarantine)
                    return replace(
                        repair,
                        quarantine=quarantine,
                        bytes_moved=result.file_size,
                        journal_removed=True,
                        index_fixed=True,
                    )
                moved = self._quarantine_tail(path, quarantine, damage.offset)
                log.warning(
                    "journal %s: moved %d damaged bytes from line %d to %s",
                    path,
                    moved,
                    damage.line,
                    quarantine,
                )
                repair = replace(repair, quarantine=quarantine, bytes_moved=moved)
            try:
                before = self._index.get(thread_id)
            except IndexUnavailable:
                before = None
            state = self._load_state(thread_id, locked=True, force_index=True)
            assert state is not None  # locked loads repair or raise
            if before != self._row(thread_id, state):
                repair = replace(repair, index_fixed=True)
            return repair

    def _quarantine_tail(self, path: Path, quarantine: Path, offset: int) -> int:
        """Copy the journal from ``offset`` into ``quarantine`` (synced), then cut it there."""
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
        _fsync_dir(self.threads_dir)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        return moved

    def _reindex_thread_sync(self, thread_id: str) -> bool:
        """Rebuild one index row from a full scan; return True when the thread is indexed."""
        self._ensure_ready()
        self._start_session()
        with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
            self._states.pop(thread_id, None)
            self._damaged.pop(thread_id, None)
            try:
                file = open(self.journal_path(thread_id), "rb")
            except FileNotFoundError:
                self._delete_row(thread_id)
                return False
            with file:
                st = os.fstat(file.fileno())
                result = scan(file, st.st_ino, None, thread_id=thread_id)
            if result.state is not None and result.damage is None:
                self._put_rows([self._row(thread_id, result.state)])
                self._states[thread_id] = result.state
                return True
            if result.damage is not None and result.damage.automatic:
                # A crash mid-write: cut (or terminate) the last line, as opening would.
                self._load_state(thread_id, locked=True, force_index=True)
                return True
            # A damaged journal keeps no row: listing it would promise what loading refuses.
            self._delete_row(thread_id)
            return False

    def _prune_index_sync(self) -> int:
        """Remove the rows of journals that no longer exist; return how many."""
        self._ensure_ready()
        removed = 0
        for thread_id in set(self._index.sizes()) - set(self._journal_files()):
            with self._guard(thread_id), ProcessLock(self._lock_path(thread_id)):
                if not self.journal_path(thread_id).exists():
                    self._delete_row(thread_id)
                    removed += 1
        return removed

    # --- the ThreadStore API --------------------------------------------------------------

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread's journal (atomically, with its metadata as the first line)."""
        validate_thread_id(metadata.thread_id)
        return await self._run(self._create_sync, metadata)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata (from the index, plus whatever the journal gained)."""
        validate_thread_id(thread_id)
        return await self._run(self._metadata_sync, thread_id)

    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata."""
        validate_thread_id(thread_id)
        changes = metadata_changes(title, extra)
        if not changes:
            return await self.get_thread(thread_id)
        # UnserializableEventError (naming the value) before anything is written.
        check_value(changes, what="the thread's new metadata")
        result: ThreadMetadata = await self._submit(self._meta_commit(thread_id, changes))
        return result

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append ``events`` as one atomic line, durable (per the mode) before returning.

        With ``expected_last_sequence`` N the append happens only when the thread's newest
        event is sequence N (0: no events); otherwise ``SequenceConflictError`` is raised
        and nothing is written. The check is made under the thread's writer lock, which
        other tasks and processes take too, so no append can get between check and write.
        """
        validate_thread_id(thread_id)
        if not events:
            if expected_last_sequence is not None:
                last = (await self.get_thread(thread_id)).last_sequence
                if last != expected_last_sequence:
                    raise SequenceConflictError.conditional(thread_id, expected_last_sequence, last)
            return []
        events_json = dumps_list(events)
        result: list[JournalEvent] = await self._submit(
            self._events_commit(thread_id, events_json, list(events), expected_last_sequence)
        )
        return result

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim (same sequences and times), atomically."""
        validate_thread_id(thread_id)
        if not entries:
            return
        check_consecutive(thread_id, entries)
        payloads = dumps_each([entry.event for entry in entries])
        await self._submit(self._import_commit(thread_id, list(entries), payloads))

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the events with sequence above ``after``, streaming the journal."""
        validate_thread_id(thread_id)
        if limit is not None and limit < 1:
            return []
        return await self._run(self._read_sync, thread_id, after, None, limit, "seek")

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return up to ``limit`` events below ``before`` (newest when None), ascending.

        Finds the page by a binary search over the journal, so paging costs about the same
        anywhere in a long thread.
        """
        validate_thread_id(thread_id)
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._run(self._page_sync, thread_id, before, limit)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last boundary on, reading from its remembered offset."""
        validate_thread_id(thread_id)
        return await self._run(self._read_sync, thread_id, 0, None, None, "replay")

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return a context manager holding the thread's lease (``leases/<id>.lease``).

        An OS file lock: refused with ``ThreadBusyError`` naming the holder while another
        task or process holds it, released by the OS when the holder dies.
        """
        return self._leases.lease(thread_id, owner=owner)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first, from the index."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._run(self._list_sync, cursor, limit)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's journal and its index row."""
        validate_thread_id(thread_id)
        await self._run(self._delete_sync, thread_id)

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the size of the thread's journal file in bytes."""
        path = self.journal_path(thread_id)

        def size() -> int:
            try:
                return os.stat(path).st_size
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None

        return await self._run(size)

    async def journal_ids(self) -> list[str]:
        """Return the id of every journal on disk, sorted (whether or not it is indexed)."""
        return await self._run(self._journal_ids_sync)

    async def check_thread(self, thread_id: str) -> ThreadCheck:
        """Return what a full check of a thread's journal and index row finds (no changes)."""
        validate_thread_id(thread_id)
        return await self._run(self._check_sync, thread_id)

    async def repair_thread(self, thread_id: str) -> ThreadRepair:
        """Repair a thread: move a damaged tail to a quarantine file, fix its index row.

        Never deletes data: the damaged part (from the first bad line to the end) is copied
        to ``<journal>.quarantine-<ms>`` and synced before the journal is cut; a journal
        without a valid first line is renamed to its quarantine name as a whole.
        """
        validate_thread_id(thread_id)
        return await self._run(self._repair_sync, thread_id)

    async def reindex_thread(self, thread_id: str) -> bool:
        """Rebuild a thread's index row from its journal; return True when it is indexed.

        A journal with damage keeps no row (repair it first).
        """
        validate_thread_id(thread_id)
        return await self._run(self._reindex_thread_sync, thread_id)

    async def reindex(self) -> int:
        """Rebuild the whole listing index from the journals; return how many it holds."""
        count = 0
        for thread_id in await self.journal_ids():
            count += await self.reindex_thread(thread_id)
        await self._run(self._prune_index_sync)
        return count

    async def prune_index(self) -> int:
        """Remove index rows whose journal no longer exists; return how many were removed."""
        return await self._run(self._prune_index_sync)

    async def aclose(self) -> None:
        """Close the store; later calls raise ``StoppedError``."""
        if self._closed:
            return
        self._closed = True
        await anyio.to_thread.run_sync(self._close_sync)

    def _close_sync(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

        if self._session_started and not self._index_behind and self.durability != "none":
            # The marker may go only once our rows are durable: a power cut could otherwise
            # lose rows that nothing would tell a later store to rebuild.
            try:
                self._index.make_durable()
            except IndexUnavailable:
                self._index_behind = True
        if self._index_behind:
            self._session.abandon()
        else:
            self._session.end()
        self._index.close()


class JsonlThreadStoreFactory(ThreadStoreFactory):
    """Opens JSONL thread stores under ``base_path`` (``durability``: fsync, group, none)."""

    id = "jsonl"

    def __init__(self, base_path: str | os.PathLike[str], *, durability: str = "fsync") -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = Path(base_path).expanduser()
        self.durability = durability

    def _prepare(self) -> JsonlThreadStore:
        created = not self.base_path.exists()
        for sub in ("threads", "locks", "tmp", "sessions"):
            (self.base_path / sub).mkdir(parents=True, exist_ok=True)
        if created and self.durability != "none":
            _fsync_dir(self.base_path)
            _fsync_dir(self.base_path.parent)
        store = JsonlThreadStore(self.base_path, durability=self.durability)
        store._ensure_ready()
        return store

    async def open(self) -> JsonlThreadStore:
        """Return a store on ``base_path``, creating its directories (made durable).

        Opening checks for writers that died since the index was last updated and catches
        the index up from their journals (or builds it, the first time).
        """
        try:
            return await anyio.to_thread.run_sync(self._prepare)
        except OSError as exc:
            raise StoreError(
                f"cannot use {self.base_path} for the JSONL thread store: {exc.strerror or exc}"
            ) from exc

    def describe(self) -> str:
        """Return where the journals live."""
        return f"jsonl at {self.base_path} (durability {self.durability})"
