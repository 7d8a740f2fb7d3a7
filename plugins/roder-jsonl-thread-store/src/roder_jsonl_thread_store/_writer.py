"""Writing a JSONL store: the commit pipeline (one line per batch, one write, one sync).

A commit takes the thread's lock (in this process, then across processes: a ``flock`` on the
journal, through the descriptor it then appends with), brings the known state up to the
journal's end (moving a torn tail a dead writer left to a quarantine file),
appends its line(s) with one ``write``, syncs per the durability mode, updates the index
row, and releases. :meth:`JournalWriter.commit` takes a batch of commits to one thread or
many, so that ``group`` durability (``roder_api.storekit.GroupCommit``) writes and syncs
every commit that arrived during the previous sync together.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from roder_api.codec import check_value, to_dict
from roder_api.errors import (
    SequenceConflictError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
)
from roder_api.events import Event, JournalEvent
from roder_api.inference import TokenUsage
from roder_api.storekit import (
    FollowOn,
    WorkerCall,
    check_expected,
    open_close_on_fork,
    start_in_worker,
)
from roder_api.threads import ThreadMetadata, validate_thread_id
from roder_jsonl_thread_store._core import (
    StoreCore,
    datasync,
    disk_hint,
    fsync_dir,
    log,
    now_ms,
    quarantine_path,
    quarantine_tail,
    write_all,
)
from roder_jsonl_thread_store._format import (
    FORMAT_VERSION,
    encode_record,
    events_list,
    events_record,
    line_crc,
)
from roder_jsonl_thread_store._journal import (
    Damage,
    JournalState,
    advance,
    copy_state,
    header_metadata,
)
from roder_jsonl_thread_store._locks import (
    APPEND,
    HAVE_FLOCK,
    KeptJournals,
    ProcessLock,
    fallback_lock,
    lock_directory_shared,
    lock_file,
    unlock,
)
from roder_jsonl_thread_store._reader import JournalReader

SYNC_WORKERS = 8
"""How many journals of one group commit are synced in parallel at most (on the store kit's
worker threads, ``roder_api.storekit.start_in_worker``). On ext4 here, 32 journals
synced from 4 threads took half the time of syncing them one after the other; more threads
were slower again (the journal commits serialise)."""


@dataclass(slots=True)
class Commit:
    """One call's worth of lines for one thread, with its outcome.

    ``build`` runs with the thread's writer lock held: it returns the line(s) to append
    after ``state`` and advances ``state`` over them (or raises to refuse the commit).
    """

    thread_id: str
    build: Callable[[JournalState], bytes]
    result: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Held:
    """A thread locked for a batch, with what is being written to it.

    ``fd`` is the journal, open for appending and holding its writer lock (None when there
    is no journal), ``stat`` what it was when locked; ``fallback`` the lock where ``flock``
    does not exist.
    """

    thread_id: str
    guard: threading.Lock
    commits: list[Commit]
    fd: int | None = None
    stat: os.stat_result | None = None
    fallback: Any = None
    before: JournalState | None = None
    after: JournalState | None = None
    data: bytes = b""
    error: BaseException | None = None


class JournalWriter:
    """The write side of one store: commits, creating and deleting journals."""

    def __init__(self, core: StoreCore, reader: JournalReader) -> None:
        self.core = core
        self.reader = reader
        self.kept = KeptJournals()  # descriptors kept open between commits (POSIX)
        # A test seam for crash tests: called after a journal write is synced and before the
        # index is updated (a real child process SIGKILLs itself here).
        self.after_journal_write: Callable[[str], None] | None = None

    def locked_state(self, thread_id: str) -> JournalState:
        """Return the state at the journal's end, moving a torn tail to quarantine first.

        Hold the thread's guard and writer lock.
        """
        state, torn, size = self.reader.scan_journal(thread_id)
        if torn is None:
            return state
        self.cut_torn_tail(thread_id, torn, size)
        state, torn, size = self.reader.scan_journal(thread_id)
        if torn is not None:  # pragma: no cover - we hold the lock: nobody wrote since
            raise StoreError(f"journal of {thread_id!r} changed while its lock was held")
        return state

    def cut_torn_tail(self, thread_id: str, torn: Damage, file_size: int) -> Path:
        """Move a torn last line (a crash mid-write) to a quarantine file; lock held."""
        path = self.core.journal_path(thread_id)
        quarantine = quarantine_path(path)
        moved = quarantine_tail(path, quarantine, torn.offset)
        self.core.states.pop(thread_id, None)
        log.warning(
            "journal %s: cut a torn last line %d (%d bytes moved to %s)",
            path,
            torn.line,
            moved,
            quarantine,
        )
        return quarantine

    def commit(self, batch: list[Commit], *, defer_index: bool = False) -> list[Any]:
        """Write and sync a batch of commits (to one thread or many) under their locks.

        Returns each commit's outcome, in order: its result, or the exception to raise.
        ``defer_index``: queue the index rows (``StoreCore.defer_rows``) for the caller to
        write once its callers are woken (the group commit's ``after``), not before.
        """
        core = self.core
        self.reader.ensure_ready()
        core.start_session()
        by_thread: dict[str, list[Commit]] = {}
        for commit in batch:
            by_thread.setdefault(commit.thread_id, []).append(commit)
        held: list[_Held] = []
        pending: list[WorkerCall] = []
        many = len(by_thread) > 1 and core.durability != "none"
        try:
            # Sorted, so that two processes locking several threads never deadlock.
            for thread_id in sorted(by_thread):
                guard = core.guard(thread_id)
                guard.acquire()
                entry = _Held(thread_id, guard, by_thread[thread_id])
                held.append(entry)
                self._prepare(entry)
                if many and entry.data and entry.error is None:
                    # Sync this journal while the next ones are written.
                    self._start_sync(entry, pending)
            writing = [e for e in held if e.data and e.error is None]
            if many:
                for call in pending:
                    call.result()
            elif writing and core.durability != "none":
                self._sync_entry(writing[0])
            written = []
            for entry in writing:
                if entry.error is not None:
                    continue
                assert entry.after is not None
                core.states[entry.thread_id] = entry.after
                if self.after_journal_write is not None:
                    self.after_journal_write(entry.thread_id)
                written.append((entry.thread_id, entry.after))
            if defer_index:  # the rows are made when written: most never are
                core.defer_states(written)
            else:
                core.put_rows([core.row(thread_id, state) for thread_id, state in written])
        finally:
            for call in pending:
                with contextlib.suppress(BaseException):
                    call.result()  # never release a lock while its journal is syncing
            for entry in reversed(held):
                try:
                    if entry.fd is not None:  # drops the writer lock; kept open unless failed
                        path = core.journal_file(entry.thread_id)
                        self.kept.release(path, entry.fd, entry.stat, keep=entry.error is None)
                finally:
                    try:
                        if entry.fallback is not None:  # pragma: no cover - Windows
                            entry.fallback.release()
                    finally:
                        entry.guard.release()
        for entry in held:
            for commit in entry.commits:
                if entry.error is not None and commit.error is None:
                    commit.error = entry.error
        return [commit.error if commit.error is not None else commit.result for commit in batch]

    def _start_sync(self, entry: _Held, pending: list[WorkerCall]) -> None:
        """Sync ``entry``'s journal on a worker thread (here when none is free), keeping at
        most :data:`SYNC_WORKERS` syncs of this commit under way."""
        running = [call for call in pending if not call.done()]
        if len(running) >= SYNC_WORKERS:
            running[0].result()
        call = start_in_worker(self._sync_entry, entry)
        if call is None:
            self._sync_entry(entry)
        else:
            pending.append(call)

    def _prepare(self, entry: _Held) -> None:
        """Bring the thread's state to the journal's end and write its commits (unsynced)."""
        core = self.core
        thread_id = entry.thread_id
        try:
            path = core.journal_file(thread_id)
            if HAVE_FLOCK:
                # Locked in sorted order, holding nothing else that others wait for: no
                # deadlock. A missing journal is not locked: the commit only fails.
                locked = self.kept.lock(path)
                if locked is not None:
                    entry.fd, entry.stat = locked
            else:  # pragma: no cover - Windows
                entry.fallback = fallback_lock(path)
                entry.fallback.acquire()
                with contextlib.suppress(FileNotFoundError):
                    entry.fd = os.open(path, APPEND)
            if entry.fd is None:
                core.states.pop(thread_id, None)
                raise ThreadNotFoundError(thread_id)
            st = entry.stat if entry.stat is not None else os.fstat(entry.fd)
            state = core.known_state(thread_id, st) or self.locked_state(thread_id)
            work = copy_state(state)
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
                write_all(entry.fd, entry.data)
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
            datasync(entry.fd)
        except OSError as exc:
            self._undo(entry, exc)

    def _undo(self, entry: _Held, exc: OSError) -> None:
        """Leave no partial batch behind after a failed write or sync."""
        assert entry.before is not None and entry.fd is not None
        entry.error = self._cut_back(entry.thread_id, entry.fd, entry.before.size, exc)

    def _cut_back(self, thread_id: str, fd: int, size: int, exc: OSError) -> StoreError:
        """Cut a journal back to ``size`` after a failed write or sync of a batch; return
        the error its callers get."""
        self.core.states.pop(thread_id, None)
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass  # the next writer moves the torn tail to quarantine anyway
        return StoreError(
            f"could not append to {self.core.journal_path(thread_id)}: "
            f"{exc.strerror or exc}; nothing of this batch was stored{disk_hint(exc)}"
        )

    def _follow(
        self, fd: int, state: JournalState, first: Commit, follow_on: FollowOn
    ) -> JournalState:
        """Write and sync what ``follow_on`` holds after a new journal's first lines (see
        :meth:`create`); return the state after them, their entries added to ``first``'s.
        A failed write or sync is cut back and ``follow_on.error`` says why."""
        events, payloads = follow_on.take()
        if not events:
            return state
        more = self.events_commit(state.metadata.thread_id, events_list(payloads), events)
        work = copy_state(state)
        try:
            write_all(fd, more.build(work))
            self.core.sync(fd)
        except OSError as exc:
            follow_on.error = self._cut_back(state.metadata.thread_id, fd, state.size, exc)
            return state
        first.result += more.result
        return work

    # --- the commits ----------------------------------------------------------------------

    @staticmethod
    def events_commit(
        thread_id: str,
        events_json: bytes,
        events: Sequence[Event],
        expected_last_sequence: int | None = None,
    ) -> Commit:
        """Return the commit of one events batch (conditional on the last sequence)."""
        commit = Commit(thread_id, lambda state: b"")

        def build(state: JournalState) -> bytes:
            # Called with the thread's writer lock held (in this process and across
            # processes): nothing can append between this check and the write.
            last = state.metadata.last_sequence
            check_expected(thread_id, expected_last_sequence, last)
            first = last + 1
            now = now_ms()
            line = events_record(first, now, events_json)
            entries = [JournalEvent(first + i, now, e) for i, e in enumerate(events)]
            advance(state, line, entries)
            commit.result = entries
            return line

        commit.build = build
        return commit

    @staticmethod
    def import_commit(
        thread_id: str, entries: Sequence[JournalEvent], payloads: Sequence[bytes]
    ) -> Commit:
        """Return the commit of imported events (their own sequences and times)."""

        def build(state: JournalState) -> bytes:
            expected = state.metadata.last_sequence + 1
            if entries[0].sequence != expected:
                raise SequenceConflictError(thread_id, expected, entries[0].sequence)
            # One line per imported event keeps each event's own recorded time.
            lines = [
                events_record(entry.sequence, entry.recorded_at_ms, events_list([payload]))
                for entry, payload in zip(entries, payloads, strict=True)
            ]
            for line, entry in zip(lines, entries, strict=True):
                advance(state, line, [entry])
            return b"".join(lines)

        return Commit(thread_id, build)

    @staticmethod
    def meta_commit(thread_id: str, changes: dict[str, Any]) -> Commit:
        """Return the commit of a metadata change (title, extra)."""
        commit = Commit(thread_id, lambda state: b"")

        def build(state: JournalState) -> bytes:
            now = now_ms()
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

    # --- creating and deleting ------------------------------------------------------------

    def create(
        self,
        metadata: ThreadMetadata,
        first: Commit | None = None,
        follow_on: FollowOn | None = None,
    ) -> ThreadMetadata:
        """Create a thread's journal atomically, with its metadata as the first line (and
        the lines of ``first``, an events commit, after it: in the same write and sync).

        Two syncs make the new thread durable before this returns, and no journal is ever
        without its first line: the line is written to a new file under ``tmp/`` and
        synced, then linked into place (``link`` is atomic and refuses to replace an
        existing journal), then the directory is synced (the new name survives a power
        cut). The journal's state is built from the line just written (no rescan), and its
        descriptor is kept open unlocked (``KeptJournals``): the first append finds both.
        Its index row is deferred like a group commit's (``INDEX_FLUSH_INTERVAL_S``):
        listings here write it first, another process's may lag by that much, and the next
        opener after a crash catches it up.

        The new file is locked before it is linked, and this holds the threads directory
        shared (see ``_locks``) until the journal is durable: a writer in another process
        waits for that, and nobody excluding writers of a missing journal sees one appear.
        No lock file is made: the only file created is the journal. What ``follow_on``
        holds once the journal is linked is written after ``first``'s lines and the file
        synced again (:meth:`_follow`), before the directory: on ext4 that sync makes the
        new name durable too, and the directory's sync after it finds little left to do.
        """
        core = self.core
        self.reader.ensure_ready()
        core.start_session()
        thread_id = metadata.thread_id
        path = core.journal_file(validate_thread_id(thread_id))
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0, open_turns=())
        check_value(stored, what="the thread's metadata")
        line = encode_record({"v": FORMAT_VERSION, "k": "create", "meta": to_dict(stored)})
        with core.guard(thread_id), contextlib.ExitStack() as held:
            if not HAVE_FLOCK:  # pragma: no cover - Windows
                held.enter_context(fallback_lock(path))
            directory = lock_directory_shared(core.threads_dir)
            if directory is not None:
                held.callback(unlock, directory)
            tmp = f"{core.tmp_dir}{os.sep}{thread_id}.{os.getpid()}.{threading.get_ident()}.tmp"
            closing = held.enter_context(contextlib.ExitStack())  # the new file, on failure
            try:
                # Registered with its open: a forked child must not keep the new journal locked.
                fd = open_close_on_fork(tmp, APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
                closing.callback(unlock, fd)  # closing it drops the writer lock
                if HAVE_FLOCK:
                    lock_file(fd)  # nobody else knows the file yet: never waits
                state = JournalState(0, len(line), 1, line_crc(line), header_metadata(line), 0, 0)
                write_all(fd, line + first.build(state) if first is not None else line)
                core.sync(fd)
                st = os.fstat(fd)
                state.inode = st.st_ino
                os.link(tmp, path)
                if follow_on is not None and first is not None:
                    state = self._follow(fd, state, first, follow_on)
            except FileExistsError:
                raise ThreadExistsError(thread_id) from None
            except OSError as exc:
                # A full or failing disk: no journal was made; say so as a StoreError.
                raise StoreError(
                    f"could not create thread {thread_id!r} in {core.threads_dir}: "
                    f"{exc.strerror or exc}; nothing was stored{disk_hint(exc)}"
                ) from exc
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if core.durability != "none":
                if directory is not None:
                    os.fsync(directory)
                else:  # pragma: no cover - Windows
                    fsync_dir(core.threads_dir)
            core.damaged.pop(thread_id, None)
            core.states[thread_id] = state
            core.defer_states([(thread_id, state)])  # see the docstring
            closing.pop_all()  # made: unlocked and kept open for the first append instead
            self.kept.release(path, fd, st, keep=True)
        core.flush_rows_soon(not_now=True)
        return state.metadata

    def delete(self, thread_id: str) -> None:
        """Delete a thread's journal and its index row."""
        core = self.core
        self.reader.ensure_ready()
        core.start_session()
        path = core.journal_path(thread_id)
        with core.guard(thread_id), ProcessLock(core.lock_path(thread_id)):
            self.kept.forget(core.journal_file(thread_id))
            try:
                os.unlink(path)
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            finally:
                core.states.pop(thread_id, None)
            core.sync_dir(core.threads_dir)
            core.delete_row(thread_id)

    def close(self) -> None:
        """Close the journals kept open (the syncs are waited for: nothing to stop)."""
        self.kept.close()
