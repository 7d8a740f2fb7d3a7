"""Reading a JSONL store: a journal's state, events, pages, listings. Reads never write.

A journal's state comes from the listing index (which says how much of the journal it
covers) plus a scan of whatever the journal gained since. A torn last line (no newline: a
write in progress, or one a dead writer left) is skipped: the state ends before it, and the
next write to the thread moves it to a quarantine file. Any other damage is refused with
``StoreCorruptedError`` and left for ``roder fsck --repair``.

The index is opened on first use. It can fall behind a journal only when a process dies
between the journal write and the index update: every store that writes holds a locked
session marker, and a marker whose lock can be taken belongs to a dead process, so whoever
finds one (on open, and before each listing) catches the index up from the journals. A store
that may not write its directory (read-only, or another user's) builds the index in memory
instead and changes nothing on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

import orjson

from roder_api.codec import from_dict, loads_json
from roder_api.errors import StoreError, ThreadNotFoundError
from roder_api.events import JournalEvent
from roder_api.storekit import decode_cursor, encode_cursor
from roder_api.threads import EventPage, ThreadMetadata, ThreadPage, ThreadSnapshot
from roder_jsonl_thread_store._core import StoreCore, damage_error, log, now_ms
from roder_jsonl_thread_store._format import (
    LINE_END,
    RECORD_START,
    line_crc,
)
from roder_jsonl_thread_store._index import IndexOutdated, IndexRow, IndexUnavailable
from roder_jsonl_thread_store._journal import (
    Damage,
    JournalState,
    last_line_damage,
    lost_lines,
    scan,
)
from roder_jsonl_thread_store._lines import read_events
from roder_jsonl_thread_store._locks import HAVE_FLOCK, ProcessLock, bury, dead_sessions
from roder_jsonl_thread_store._turns import read_turns

_TAIL_LEN = len(LINE_END)

T = TypeVar("T")

SEEK_WINDOW = 16384
"""A binary search over a journal stops when the range is this many bytes; then it reads."""


class JournalReader:
    """The read side of one store: opening the index, journal states, events, listings."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    # --- the index and its catch-up -------------------------------------------------------

    def ensure_ready(self) -> None:
        """Open the index on first use (in memory when the store may not be written)."""
        core = self.core
        if core.ready:
            return
        with core.ready_lock:
            if core.ready:
                return
            outdated: Path | None = None
            if core.may_write():
                if not core.base_path.exists():
                    core.base_path.mkdir(parents=True, exist_ok=True)
                try:
                    core.index.open()
                except IndexOutdated as exc:
                    outdated = self.set_index_aside(str(exc), outdated=True)
                    core.index.open()
                except IndexUnavailable as exc:
                    self.set_index_aside(str(exc))
                    core.index.open()
            else:
                core.read_only = True
                core.index.open_in_memory()
            if core.index.created or core.read_only:
                self.catch_up()
                if outdated is not None:
                    # Rebuilt: the older index is not damage to keep for a look.
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{outdated}{suffix}").unlink(missing_ok=True)
            else:
                self.check_sessions(force=not HAVE_FLOCK)
            core.ready = True

    def set_index_aside(self, why: str, *, outdated: bool = False) -> Path:
        """Move a damaged (or, ``outdated``, older) index file aside; return where to.

        The index is then rebuilt from the journals. A damaged one is kept
        (``index.sqlite3.bad-<ms>``) for a look; an older one (``.old-<ms>``) is removed
        by the caller once the rebuild is done.
        """
        core = self.core
        core.index.close()
        aside = core.index_path.with_name(
            f"index.sqlite3.{'old' if outdated else 'bad'}-{now_ms()}"
        )
        if outdated:
            log.info("upgrading the JSONL index %s (%s)", core.index_path, why)
        else:
            log.warning("the JSONL index %s is unusable (%s); rebuilding it", core.index_path, why)
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(core.index_path) + suffix)
            if source.exists():
                os.replace(source, Path(str(aside) + suffix))
        return aside

    def check_sessions(self, *, force: bool = False) -> None:
        """Catch the index up when a writer died since it was last checked."""
        core = self.core
        dead = dead_sessions(core.sessions_dir, core.session.path)
        if dead or force:
            if dead:
                log.info("a writer of %s died; catching the index up", core.base_path)
            try:
                self.catch_up()
            except BaseException:
                bury(dead, remove=False)  # keep the markers: whoever looks next catches up
                raise
            bury(dead, remove=not core.read_only)

    def catch_up(self, progress: Callable[[str], None] | None = None) -> int:
        """Bring every index row up to its journal; return how many rows changed.

        Indexes each journal up to its last good line; cuts nothing.
        """
        core = self.core
        rows = core.index.sizes()
        files = core.journal_files()
        changed = 0
        for thread_id, st in files.items():
            known = rows.get(thread_id)
            if known is None or known[0] != st.st_ino or known[1] != st.st_size:
                try:
                    with self.writers_excluded(thread_id):
                        state = self.scan_journal(thread_id)[0]
                        core.put_rows([core.row(thread_id, state)])
                    changed += 1
                except ThreadNotFoundError:
                    pass
                except StoreError as exc:
                    log.warning("cannot index thread %s: %s", thread_id, exc)
            if progress:
                progress(thread_id)
        for thread_id in rows.keys() - files.keys():
            with self.writers_excluded(thread_id):
                if not core.journal_path(thread_id).exists():
                    core.delete_row(thread_id)
                    core.states.pop(thread_id, None)
                    changed += 1
        return changed

    def writers_excluded(self, thread_id: str) -> _Excluded:
        """Return a context holding the thread's guard and, when we may write, its lock."""
        return _Excluded(self.core, thread_id)

    # --- a journal's state ----------------------------------------------------------------

    def _base_state(
        self, thread_id: str, file: BinaryIO, st: os.stat_result
    ) -> tuple[JournalState | None, IndexRow | None]:
        """Return a known state that the journal extends (cached or from the index).

        Also the index row when there is one and the state is not from this process's
        cache: a scan is then compared with it (a journal shorter than its row is damage).
        """
        cached = self.core.states.get(thread_id)
        if cached is not None and cached.inode == st.st_ino and cached.size <= st.st_size:
            return cached, None
        try:
            row = self.core.index.get(thread_id)
        except IndexUnavailable:
            row = None
        if row is None:
            return None, None
        if row.inode != st.st_ino or row.size > st.st_size:
            # Another file (a copy restored: new inode numbers) or a shorter one: rescan,
            # then compare with the row.
            return None, row
        head = file.read(RECORD_START)
        if line_crc(head) != row.head_crc:
            return None, None
        meta = from_dict(loads_json(row.meta))
        state = JournalState(
            inode=row.inode,
            size=row.size,
            lines=row.lines,
            head_crc=row.head_crc,
            metadata=meta,
            boundary_offset=row.boundary_offset,
            boundary_sequence=row.boundary_sequence,
        )
        return state, row

    def _compare_row(
        self, thread_id: str, path: Path | str, state: JournalState, row: IndexRow
    ) -> None:
        """Refuse a scanned journal that lost lines its index row knows; else refresh it.

        A row of another inode whose journal checks out (a store copied or restored: the
        same bytes under new inode numbers) is brought up to the file, so the next open
        trusts it again; only when the store may write, and only if nobody changed the row
        meanwhile.
        """
        core = self.core
        meta = from_dict(loads_json(row.meta))
        lost = lost_lines(state, row.lines, row.head_crc, meta.last_sequence)
        if lost is not None:
            core.states.pop(thread_id, None)
            raise damage_error(thread_id, path, lost)
        if row.inode != state.inode and not core.read_only:
            try:
                core.index.refresh(core.row(thread_id, state), row.inode, row.size)
            except IndexUnavailable as exc:
                log.warning("could not refresh the index row of %s: %s", thread_id, exc)

    def scan_journal(self, thread_id: str) -> tuple[JournalState, Damage | None, int]:
        """Return the journal's state up to its last good line, a torn tail, the file size.

        Hold the thread's guard. Raises ``StoreCorruptedError`` (or ``StoreError`` for a
        newer format) for damage that is not a torn tail; changes nothing.
        """
        core = self.core
        path = core.journal_path(thread_id)
        try:
            file = open(path, "rb")
        except FileNotFoundError:
            core.states.pop(thread_id, None)
            raise ThreadNotFoundError(thread_id) from None
        with file:
            return self._scan_file(thread_id, path, file)

    def _scan_file(
        self, thread_id: str, path: Path | str, file: BinaryIO
    ) -> tuple[JournalState, Damage | None, int]:
        """:meth:`scan_journal` of a journal already open (at its start); hold the guard."""
        core = self.core
        st = os.fstat(file.fileno())
        known = core.damaged.get(thread_id)
        row: IndexRow | None = None
        if known is not None:
            if (known[0], known[1]) == (st.st_ino, st.st_size):
                raise known[2]
            del core.damaged[thread_id]
            core.states.pop(thread_id, None)
            base = None
        else:
            base, row = self._base_state(thread_id, file, st)
        if base is not None and base.size == st.st_size:
            if row is not None:
                # Taken from the index without reading the journal: check its last line
                # (one read) before anyone continues it; reads check every line they read.
                tail = last_line_damage(file, base)
                if tail is not None:
                    core.states.pop(thread_id, None)
                    raise damage_error(thread_id, path, tail)
            core.states[thread_id] = base
            return base, None, st.st_size
        result = scan(file, st.st_ino, base, thread_id=thread_id)
        if result.damage is not None and not result.damage.automatic and base is not None:
            # Judge damage from the first line, never from a remembered offset: a repair
            # elsewhere may have cut the journal below it and written it again.
            result = scan(file, st.st_ino, None, thread_id=thread_id)
        damage, state = result.damage, result.state
        if damage is not None and not damage.automatic:
            core.states.pop(thread_id, None)
            error = damage_error(thread_id, path, damage)
            # Remembered as a read's find is, until the file changes: an index row that
            # vouches for the whole file may appear later (a writer's deferred row), and a
            # write must not then take the journal's state from it and continue it.
            core.damaged[thread_id] = (st.st_ino, st.st_size, error)
            raise error
        if state is None:
            core.states.pop(thread_id, None)
            where = damage if damage is not None else Damage(0, 1, "header", "it is empty")
            raise damage_error(thread_id, path, where)
        if row is not None:
            self._compare_row(thread_id, path, state, row)
        core.states[thread_id] = state
        return state, damage, st.st_size

    def state(self, thread_id: str) -> JournalState:
        """Return the thread's state up to its last good line."""
        self.ensure_ready()
        with self.core.guard(thread_id):
            return self.scan_journal(thread_id)[0]

    def metadata(self, thread_id: str) -> ThreadMetadata:
        """Return the thread's metadata.

        When this store knows the journal's state and one ``stat`` finds the file as that
        state left it (the same inode and size), it is that state's, as :meth:`state`
        would find it, without opening the file: a session's poll for other processes'
        appends asks this of every waiting thread, several times a second (one system
        call instead of an open, an ``fstat`` and a close, and no file object).
        """
        core = self.core
        if thread_id in core.states:  # else there is nothing to compare a stat with
            try:
                known = core.known_state(thread_id, os.stat(core.journal_file(thread_id)))
            except OSError:
                known = None  # gone or unreadable: the read below says which
            if known is not None:
                return known.metadata
        return self.state(thread_id).metadata

    # --- events ---------------------------------------------------------------------------

    def _seek_sequence(self, file: BinaryIO, state: JournalState, target: int) -> int:
        """Return a line offset at or before the line holding sequence ``target``.

        A binary search over byte offsets (sequences grow with the offset), then the reader
        skips forward: the cost grows with the log of the journal's length. A target in the
        last events lines this store wrote (``JournalState.tail``) is found without a search
        (a session reading back its last turn, before each turn).
        """
        tail = state.tail
        if tail and target >= tail[0][1]:
            for offset, first in reversed(tail):
                if first <= target:
                    return offset
        lo, hi = 0, state.size
        while hi - lo > SEEK_WINDOW:
            mid = (lo + hi) // 2
            file.seek(mid)
            start = mid + len(file.readline())
            found: int | None = None
            while start < hi:
                raw = file.readline()
                if not raw:
                    break
                try:
                    record = loads_json(raw[RECORD_START:-_TAIL_LEN])
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

    def _open_known(self, thread_id: str) -> tuple[BinaryIO, str, JournalState]:
        """Open a thread's journal; return it (at its start), its path and its state."""
        core = self.core
        path = core.journal_file(thread_id)  # a plain string: pathlib costs more than a read
        try:
            file = open(path, "rb")
        except FileNotFoundError:
            with core.guard(thread_id):
                core.states.pop(thread_id, None)
            raise ThreadNotFoundError(thread_id) from None
        try:
            state = core.known_state(thread_id, os.fstat(file.fileno()))
            if state is None:
                # Not known yet: the state of the journal just opened (one open, not two).
                self.ensure_ready()
                with core.guard(thread_id):
                    state = self._scan_file(thread_id, path, file)[0]
        except BaseException:
            file.close()
            raise
        return file, path, state

    def read(
        self, thread_id: str, after: int, before: int | None, limit: int | None, mode: str
    ) -> list[JournalEvent]:
        """Return events with ``after < sequence < before`` (``mode``: replay or seek)."""
        file, path, state = self._open_known(thread_id)
        with file:
            if after >= state.metadata.last_sequence:
                return []
            offset = 0
            if mode == "replay":
                offset = state.boundary_offset
                after = max(after, state.boundary_sequence - 1)
            elif after > 0:
                offset = self._seek_sequence(file, state, after + 1)
            window = (offset, after, before, limit)
            return read_events(self.core, file, path, thread_id, state, window)

    def snapshot(self, thread_id: str) -> ThreadSnapshot:
        """Return the thread's metadata and items by turn, from one state of its journal."""
        file, path, state = self._open_known(thread_id)
        with file:
            turns = read_turns(self.core, file, path, thread_id, state)
            return ThreadSnapshot(state.metadata, turns)

    def page(self, thread_id: str, before: int | None, limit: int) -> EventPage:
        """Return the :meth:`ThreadStore.event_page` answer."""
        state = self.state(thread_id)
        last = state.metadata.last_sequence
        if before is None or before > last + 1:
            before = last + 1
        if before <= 1:
            return EventPage((), None)
        first = max(1, before - limit)
        events = self.read(thread_id, first - 1, before, limit, "seek")
        return EventPage(tuple(events), first if first > 1 else None)

    def _query(self, query: Callable[[], T]) -> T:
        """Return ``query()`` of the index, caught up first (as fresh as a listing); an
        unusable index is set aside and rebuilt from the journals, then asked again."""
        core = self.core
        self.ensure_ready()
        self.check_sessions(force=not HAVE_FLOCK)
        try:
            return query()
        except IndexUnavailable as exc:
            if core.read_only:
                raise StoreError(f"cannot read the JSONL index in memory: {exc}") from exc
            with core.ready_lock:
                self.set_index_aside(str(exc))
                core.index.open()
                self.catch_up()
            return query()

    def pending(self, updated_after_ms: int, limit: int) -> list[str]:
        """Return the threads with an open turn, newest update first: one index query."""
        return self._query(lambda: self.core.index.pending(updated_after_ms, limit))

    def list(self, cursor: str | None, limit: int) -> ThreadPage:
        """Return a page of threads, newest update first, from the index."""
        position = decode_cursor(cursor) if cursor else None
        rows = self._query(lambda: self.core.index.page(position, limit + 1))
        metas = [from_dict(loads_json(row.meta)) for row in rows[:limit]]
        more = len(rows) > limit
        last = metas[-1] if metas else None
        next_cursor = encode_cursor(last.updated_at_ms, last.thread_id) if more and last else None
        return ThreadPage(tuple(metas), next_cursor)


class _Excluded:
    """Holds a thread's guard and, unless the store is read-only, its writer lock."""

    __slots__ = ("_core", "_lock", "_thread_id")

    def __init__(self, core: StoreCore, thread_id: str) -> None:
        self._core = core
        self._thread_id = thread_id
        self._lock: ProcessLock | None = None

    def __enter__(self) -> None:
        guard = self._core.guard(self._thread_id)
        guard.acquire()
        if not self._core.read_only:
            lock = ProcessLock(self._core.lock_path(self._thread_id))
            try:
                lock.__enter__()
            except OSError:
                # The journal and its directory cannot be opened (another user's store, a
                # directory not made yet): there is no writer this process could exclude.
                return
            except BaseException:
                guard.release()
                raise
            self._lock = lock

    def __exit__(self, *exc_info: object) -> None:
        lock, self._lock = self._lock, None
        try:
            if lock is not None:
                lock.__exit__(None, None, None)
        finally:
            self._core.guard(self._thread_id).release()
