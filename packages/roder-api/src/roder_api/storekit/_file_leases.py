"""Thread leases held by an OS file lock: one lease file per thread in a directory.

The lease of thread ``t`` is an exclusive ``flock(2)`` (``LOCK_EX | LOCK_NB``) on
``<directory>/t.lease``, taken on a descriptor of its own and held for the lease's life. A
``flock`` belongs to the open file, not to the process, so two leases taken in one process
exclude each other as two processes do; and the kernel drops it when the holder's process
dies, however it dies (``kill -9`` included), so a dead holder never blocks anyone. A child
the holder forks (a tool's background job) would share the lock through the inherited
descriptor and keep it past the holder's death: the descriptor is close-on-exec and is
replaced by ``/dev/null`` in forked children (:mod:`roder_api.storekit._fork_guard`).

The holder writes its :class:`~roder_api.threads.LeaseHolder` as JSON into the locked file,
and empties the file before it lets go; a refused caller reads it to name the holder in its
:class:`~roder_api.errors.ThreadBusyError`. Lease files are never removed: unlinking a
locked file lets a later opener lock a new file of the same name while the old one is held.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio
import orjson

from roder_api._leases import LeaseHolder, ThreadLease
from roder_api._thread_contract import validate_thread_id
from roder_api.errors import StoreError, ThreadBusyError
from roder_api.storekit._fork_guard import forget_on_fork, open_close_on_fork
from roder_api.storekit._workers import run_in_worker

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]  # FileLeases refuses to work there

LEASE_SUFFIX = ".lease"
"""The suffix of a lease file (``<thread id>.lease``)."""

_HOLDER_READ_TRIES = 50
"""How often a refused caller reads an empty lease file before it stops waiting for the
holder to write itself there (the holder writes right after it locks; 1 ms apart)."""


def _encode(holder: LeaseHolder) -> bytes:
    return orjson.dumps(
        {
            "owner": holder.owner,
            "pid": holder.pid,
            "host": holder.host,
            "since_ms": holder.since_ms,
        }
    )


def _decode(data: bytes) -> LeaseHolder | None:
    try:
        value = orjson.loads(data)
        return LeaseHolder(
            str(value["owner"]), int(value["pid"]), str(value["host"]), int(value["since_ms"])
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _read_holder(fd: int) -> LeaseHolder | None:
    for _ in range(_HOLDER_READ_TRIES):
        data = os.pread(fd, 4096, 0)
        if data:
            holder = _decode(data)
            if holder is not None:
                return holder
        time.sleep(0.001)  # locked, not yet written (or being rewritten): look again
    return None


class FileLeases:
    """Thread leases as ``flock`` locks on lease files in ``directory`` (created on demand).

    :meth:`lease` has the shape of :meth:`roder_api.threads.ThreadStore.lease`, so a store
    implements its lease as ``return self._leases.lease(thread_id, owner=owner)``. Every
    blocking call runs in a worker thread (on ``limiter`` when given). A directory that
    cannot be created or written raises :class:`~roder_api.errors.StoreError` saying so.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, limiter: anyio.CapacityLimiter | None = None
    ) -> None:
        self.directory = Path(directory)
        self._limiter = limiter

    def path(self, thread_id: str) -> Path:
        """Return the lease file of a thread (validating the id)."""
        return self.directory / (validate_thread_id(thread_id) + LEASE_SUFFIX)

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return a context manager holding the thread's lease while it is entered.

        Entering raises :class:`~roder_api.errors.ThreadBusyError` at once, naming the
        holder, when another (in this process or any other) holds it.
        """
        return self._lease(self.path(thread_id), thread_id, owner)

    @asynccontextmanager
    async def _lease(self, path: Path, thread_id: str, owner: str) -> AsyncIterator[ThreadLease]:
        holder = LeaseHolder.current(owner)
        # Shielded: a lock taken by the worker thread must never be lost to a cancellation.
        with anyio.CancelScope(shield=True):
            async with self._limiter or contextlib.nullcontext():
                fd = await run_in_worker(self._acquire, path, thread_id, holder)
        try:
            yield ThreadLease(thread_id, holder)
        finally:
            await self.release(fd)

    def acquire_sync(self, thread_id: str, holder: LeaseHolder) -> int:
        """Take the thread's lease for ``holder`` in this (worker) thread; return the lock's
        descriptor, for :meth:`release_sync` or :meth:`release`. ``ThreadBusyError`` when
        another holds it. For a store that does more in the same worker call
        (``BlockingThreadStore.lease_new_thread``)."""
        return self._acquire(self.path(thread_id), thread_id, holder)

    @staticmethod
    def release_sync(fd: int) -> None:
        """Release a lease taken by :meth:`acquire_sync` (in a worker thread)."""
        FileLeases._release(fd)

    async def release(self, fd: int) -> None:
        """Release a lease taken by :meth:`acquire_sync` from the event loop (shielded: it
        is never left held by a cancellation)."""
        with anyio.CancelScope(shield=True):
            async with self._limiter or contextlib.nullcontext():
                await run_in_worker(self._release, fd)

    def _acquire(self, path: Path, thread_id: str, holder: LeaseHolder) -> int:
        if fcntl is None:  # pragma: no cover - Windows
            raise StoreError("file leases need flock(2), which this platform lacks")
        # Registered with its open: no fork can inherit it unguarded.
        open_lease = functools.partial(
            open_close_on_fork, path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        try:
            try:
                fd = open_lease()
            except FileNotFoundError:  # the first lease here: make the directory
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = open_lease()
        except OSError as exc:
            raise StoreError(
                f"cannot take the lease of thread {thread_id!r}: {path} cannot be opened "
                f"for writing ({exc.strerror or exc}); a read-only store can be read but "
                "not run"
            ) from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ThreadBusyError(thread_id, _read_holder(fd)) from None
            data = _encode(holder)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            forget_on_fork(fd)
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _release(fd: int) -> None:
        try:
            os.ftruncate(fd, 0)  # a caller refused from now on finds nobody named
        except OSError:
            pass  # closing below still releases the lease
        finally:
            forget_on_fork(fd)
            os.close(fd)
