"""Cross-process locks: writers lock the journal itself; liveness markers of writer sessions.

On POSIX the locks are ``flock(2)`` locks, taken on a freshly opened descriptor and dropped by
closing it. The kernel releases the lock of a process that dies, however it dies, so a lock
left by a dead process never blocks anyone. ``filelock`` takes the very same kind of lock; we
call ``flock`` directly because ``filelock`` 4 spends 30-90 microseconds per acquire and
release on fork and path checks (measured on ext4 here). Where ``fcntl`` does not exist
(Windows), ``filelock.FileLock`` does the job, on a ``<journal>.lock`` file next to the
journal (never on the journal: a lock file is the lock library's to open as it likes).

The writer lock of a thread is a lock on its journal file (no lock file of its own: creating
a file costs more kernel time here than the rest of a create and first append together).
Since a delete or a repair may remove or replace the journal while others wait for its lock,
whoever gets the lock checks that the path still names the file it locked, and starts over
when not. While there is no journal, :class:`ProcessLock` locks the journal's directory
exclusively instead; a creator holds the directory shared (:func:`lock_directory_shared`)
from before it looks for the journal until the new journal is durable, indexed and locked
by the creator alone, so nobody excluding writers of a missing journal sees one appear.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # the filelock fallback below takes over

from roder_api.storekit import forget_on_fork, open_close_on_fork

if TYPE_CHECKING:  # imported where used: only where there is no fcntl (Windows)
    from filelock import FileLock

HAVE_FLOCK = fcntl is not None
"""True when sessions can be told alive or dead (POSIX ``flock``)."""

_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)

APPEND = os.O_WRONLY | os.O_APPEND
"""How a writer opens the journal it locks (the descriptor it then writes through)."""


def fallback_lock(path: str | Path) -> FileLock:  # pragma: no cover - Windows
    """Return the ``filelock`` lock standing in for ``flock`` on ``path`` (no ``fcntl``)."""
    from filelock import FileLock

    return FileLock(f"{path}.lock")


def _same_file(path: str | Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return st.st_ino == own.st_ino and st.st_dev == own.st_dev


def lock_existing(path: str | Path, flags: int = os.O_RDONLY) -> int | None:
    """Lock the file at ``path`` exclusively; return its descriptor, or None when it is absent.

    Opens ``path`` with ``flags`` (no ``O_CREAT``: this never makes a file), waits for the
    ``flock``, then checks that ``path`` still names the file it locked (a delete or repair
    may have removed or replaced it meanwhile) and starts over when not. Close the
    descriptor to let the next writer in. POSIX only (``HAVE_FLOCK``).
    """
    assert fcntl is not None
    while True:
        try:
            # Registered with its open: a forked child must not keep the journal locked.
            fd = open_close_on_fork(path, flags)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(path, fd):
                return fd
        except BaseException:
            unlock(fd)
            raise
        unlock(fd)


def unlock(fd: int) -> None:
    """Close a descriptor :func:`lock_existing` returned, dropping its lock."""
    forget_on_fork(fd)
    os.close(fd)


def lock_file(fd: int) -> None:
    """Lock the open file ``fd`` exclusively (a new journal, before it is linked into place)."""
    assert fcntl is not None
    fcntl.flock(fd, fcntl.LOCK_EX)


def lock_directory_shared(directory: str | Path) -> int | None:
    """Lock ``directory`` shared (a creator's lock); return the descriptor (close to unlock).

    Returns None without ``flock`` (Windows). The descriptor can sync the directory too.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return None
    fd = open_close_on_fork(directory, _DIRECTORY)  # a forked child must not keep it
    return _locked(fd, fcntl.LOCK_SH)


def _locked(fd: int, operation: int) -> int:
    """Return ``fd`` once ``flock(fd, operation)`` holds; close it when that fails."""
    assert fcntl is not None
    try:
        fcntl.flock(fd, operation)
    except BaseException:
        os.close(fd)
        raise
    return fd


KEEP_OPEN = 16
"""How many journals' descriptors a store keeps open (unlocked) between commits."""


class KeptJournals:
    """Journal descriptors kept open between a store's commits, each unlocked meanwhile.

    A commit to a journal committed to before takes its writer lock with one ``flock`` on
    the kept descriptor and one ``stat`` of the path (still the file it locked?), instead of
    an ``open``, a ``flock``, a ``stat``, two ``fstat`` and a ``close``. Between commits
    nothing is locked, so other writers (here and in other processes) see no change. A kept
    descriptor whose path now names another file, or none (a delete or a repair replaced
    it), is closed and the journal opened anew as by :func:`lock_existing`. At most
    :data:`KEEP_OPEN` are kept (the oldest closed first). Each is registered with the fork
    guard as it is opened, so a forked child has ``/dev/null`` in its place; the child finds
    the process id changed and closes them without using them. POSIX only (``HAVE_FLOCK``).
    """

    __slots__ = ("_fds", "_lock", "_pid")

    def __init__(self) -> None:
        self._fds: dict[str, tuple[int, int, int]] = {}  # path -> (fd, st_dev, st_ino)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _take(self, path: str) -> tuple[int, int, int] | None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the fork guard nulled them
                stale, self._fds = list(self._fds.values()), {}
                self._pid = os.getpid()
                for fd, _, _ in stale:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            return self._fds.pop(path, None)

    def lock(self, path: str) -> tuple[int, os.stat_result] | None:
        """Lock the journal at ``path`` exclusively; return its descriptor (open for
        appending) and the file's ``stat``, or None when there is no journal."""
        assert fcntl is not None
        kept = self._take(path)
        if kept is not None:
            fd, dev, ino = kept
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.stat(path)
                if st.st_ino == ino and st.st_dev == dev:
                    return fd, st
            except FileNotFoundError:
                pass
            except BaseException:
                unlock(fd)
                raise
            unlock(fd)  # removed or replaced: open what the path names now
        opened = lock_existing(path, APPEND)
        if opened is None:
            return None
        try:
            return opened, os.fstat(opened)
        except BaseException:
            unlock(opened)
            raise

    def release(self, path: str, fd: int, st: os.stat_result | None, *, keep: bool) -> None:
        """Drop the lock :meth:`lock` took (or a new journal's, its create's); keep the
        descriptor open for the next commit (closing the oldest kept beyond
        :data:`KEEP_OPEN`) or, unless ``keep``, close it. Without ``st`` (a descriptor
        opened elsewhere, as where there is no ``flock``), or without ``flock``, it is
        closed. A kept descriptor must be open for appending (``APPEND``)."""
        if st is None or fcntl is None or not keep:
            unlock(fd)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            unlock(fd)
            return
        closing: list[int] = []
        with self._lock:
            if self._pid == os.getpid():
                self._fds[path] = (fd, st.st_dev, st.st_ino)
                while len(self._fds) > KEEP_OPEN:
                    closing.append(self._fds.pop(next(iter(self._fds)))[0])
            else:  # pragma: no cover - released in a child forked mid-commit
                closing.append(fd)
        for old in closing:
            unlock(old)

    def forget(self, path: str) -> None:
        """Close the kept descriptor of ``path``, if any (before deleting the journal)."""
        kept = self._take(path)
        if kept is not None:
            unlock(kept[0])

    def close(self) -> None:
        """Close every kept descriptor."""
        with self._lock:
            kept, self._fds = list(self._fds.values()), {}
            mine = self._pid == os.getpid()
        for fd, _, _ in kept:
            if mine:
                unlock(fd)
            else:  # pragma: no cover - a forked child closing its copy of the store
                with contextlib.suppress(OSError):
                    os.close(fd)


class ProcessLock:
    """The writer lock of the journal at ``path``, held by one thread of one process at a time.

    Use it as a context manager; it blocks until the lock is free. When there is no journal
    at ``path`` it holds the journal's directory exclusively instead (no journal can be
    created while it is held). Creates nothing. Re-entry is not supported.
    """

    __slots__ = ("_fd", "_fallback", "path")

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._fallback: FileLock | None = None

    @staticmethod
    def wait_for_writer(path: str | Path) -> int | None:
        """Wait until no writer holds the journal at ``path``; return a descriptor locking it.

        For readers that must not see a write half done (fsck); the lock is shared. Creates
        nothing and needs no write access: when the journal does not exist or cannot be opened,
        returns None (no lock taken). Close the descriptor to let writers in again.
        """
        if fcntl is None:  # pragma: no cover - Windows
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        return _locked(fd, fcntl.LOCK_SH)

    def __enter__(self) -> ProcessLock:
        if fcntl is None:  # pragma: no cover - Windows
            self._fallback = fallback_lock(self.path)
            self._fallback.acquire()
            return self
        directory = os.path.dirname(self.path) or "."
        while True:
            fd = lock_existing(self.path)
            if fd is not None:
                self._fd = fd
                return self
            try:
                fd = os.open(directory, _DIRECTORY)
            except FileNotFoundError:
                return self  # no directory: no journal, and nobody creating one through it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not os.path.exists(self.path):
                    self._fd = fd  # no creator holds the directory: none can link a journal
                    return self
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # created meanwhile: lock the new journal

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fallback is not None:  # pragma: no cover - Windows
            self._fallback.release()
            self._fallback = None
            return
        fd, self._fd = self._fd, None
        if fd is not None:
            unlock(fd)  # closing the last descriptor drops the flock


class WriterMarker:
    """A marker file locked for as long as this store may leave the index behind its journals.

    A store registers one before its first write and removes it on close. Whoever finds a
    marker whose lock can be taken knows its owner died (possibly between a journal write and
    the matching index update) and catches the index up from the journals.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path: Path | None = None
        self._fd: int | None = None

    def start(self, *, durable: bool = True) -> None:
        """Create and lock this session's marker (made visible only once it is locked).

        ``durable`` syncs the directory, so that the marker survives a power cut: the index
        may lose its newest rows then, and the marker is what makes the next store look.
        """
        if fcntl is None or self._fd is not None:  # pragma: no cover - Windows: no markers
            return
        name = f"{os.getpid()}-{os.urandom(6).hex()}"
        hidden = self.directory / f".{name}.tmp"
        # Registered with its open: a child forked without exec (a tool's background job)
        # must not keep this marker locked, or its writer's death is never seen.
        fd = open_close_on_fork(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            final = self.directory / f"{name}.session"
            os.rename(hidden, final)
            if durable:
                directory = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except BaseException:
            forget_on_fork(fd)
            os.close(fd)
            raise
        self._fd = fd
        self.path = final

    def end(self) -> None:
        """Remove this session's marker: everything it wrote is in the index."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self.path is not None:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            forget_on_fork(fd)
            os.close(fd)

    def abandon(self) -> None:
        """Release the marker's lock but keep the file: the next opener will catch up."""
        fd, self._fd = self._fd, None
        if fd is not None:
            forget_on_fork(fd)
            os.close(fd)


def dead_sessions(directory: Path, own: Path | None) -> list[tuple[Path, int]]:
    """Return the markers of sessions whose process died, each with a descriptor locking it.

    The caller catches the index up, then calls :func:`bury` on each.
    """
    if fcntl is None:  # pragma: no cover - Windows: no markers, callers always catch up
        return []
    found: list[tuple[Path, int]] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.endswith(".session"):
            continue
        path = Path(entry.path)
        if own is not None and path == own:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)  # flock needs no write access
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # alive
            continue
        except BaseException:
            os.close(fd)
            raise
        found.append((path, fd))
    return found


def bury(sessions: list[tuple[Path, int]], *, remove: bool = True) -> None:
    """Remove the markers of dead sessions found by :func:`dead_sessions`.

    With ``remove`` False (a store that may not write) only lets go of them.
    """
    for path, fd in sessions:
        try:
            if remove:
                os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
