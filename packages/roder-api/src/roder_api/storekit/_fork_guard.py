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
does with that number touches nothing.
"""

from __future__ import annotations

import os
import threading

_guarded: set[int] = set()
_lock = threading.Lock()


def close_on_fork(fd: int) -> None:
    """Register ``fd``: a child forked from now on gets ``/dev/null`` in its place."""
    with _lock:
        _guarded.add(fd)


def forget_on_fork(fd: int) -> None:
    """Stop replacing ``fd`` in forked children (call it before closing ``fd``)."""
    with _lock:
        _guarded.discard(fd)


def _after_fork_in_child() -> None:
    # Only the forking thread exists in the child: no lock (another thread may have held
    # it at the fork), and a copy of the set (its operations are atomic under the GIL).
    guarded = list(_guarded)
    _guarded.clear()
    if not guarded:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in guarded:
            if fd != null:
                try:
                    os.dup2(null, fd, inheritable=False)
                except OSError:
                    pass  # already closed in the parent's last moments: nothing to let go
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):  # pragma: no branch - not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["close_on_fork", "forget_on_fork"]
