"""Descriptors a forked child must not keep: what holds a lease (a locked file, a session).

A lease is held by a descriptor — a ``flock``-ed lease file, the socket of the database
session that holds an advisory lock — and a child forked without ``exec`` (a tool's
background job, ``multiprocessing`` with the ``fork`` start method) inherits every
descriptor. The lock then outlives its holder: SIGKILL the holder and the child, still
running, keeps the thread busy. ``exec`` is covered by close-on-exec (Python opens
descriptors non-inheritable, libpq marks its socket ``FD_CLOEXEC``); a fork is not, and
Linux has no close-on-fork flag. So every descriptor registered with :func:`close_on_fork`
is replaced by ``/dev/null`` in each child forked from Python (``os.register_at_fork``):
the child's copy lets go of the lock, the holder's stays, and anything the child still
does with that number touches nothing. The PostgreSQL store registers its pooled
connections too: a holder killed mid-transaction leaves row locks that its session keeps
for as long as any process holds the socket.
"""

from __future__ import annotations

import os
import threading

_guarded: dict[int, tuple[int, int]] = {}  # fd -> (st_dev, st_ino) of what it was
_lock = threading.Lock()
_SWEEP_AT_LEAST = 64
_sweep_at = _SWEEP_AT_LEAST  # the size at which the next registration looks for stale ones


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def close_on_fork(fd: int) -> None:
    """Register ``fd``: a child forked from now on gets ``/dev/null`` in its place.

    The registration remembers what ``fd`` is (device and inode): if ``fd`` is closed
    without :func:`forget_on_fork` and its number reused for another file, that file is
    left alone (a pool may close a connection without telling anyone).
    """
    global _sweep_at
    identity = _identity(fd)
    if identity is None:
        return
    with _lock:
        if len(_guarded) >= _sweep_at:
            # Now and then, not on every call: a registration is on a store's commit path
            # (the JSONL journal's writer lock), and a server may hold a thousand leases.
            for stale in [f for f, known in _guarded.items() if _identity(f) != known]:
                del _guarded[stale]  # closed (or reused) since: nothing of ours any more
            _sweep_at = max(_SWEEP_AT_LEAST, 2 * len(_guarded))
        _guarded[fd] = identity


def forget_on_fork(fd: int) -> None:
    """Stop replacing ``fd`` in forked children (call it before closing ``fd``)."""
    with _lock:
        _guarded.pop(fd, None)


def _after_fork_in_child() -> None:
    # Only the forking thread exists in the child: no lock (another thread may have held
    # it at the fork), and a copy of the mapping (its operations are atomic under the GIL).
    guarded = list(_guarded.items())
    _guarded.clear()
    if not guarded:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd, identity in guarded:
            if fd != null and _identity(fd) == identity:
                try:
                    os.dup2(null, fd, inheritable=False)
                except OSError:
                    pass  # closed meanwhile: nothing to let go
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):  # pragma: no branch - not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["close_on_fork", "forget_on_fork"]
