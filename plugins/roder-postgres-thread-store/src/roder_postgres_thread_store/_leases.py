"""Thread leases in PostgreSQL: a session advisory lock on a connection held for the lease.

``pg_try_advisory_lock`` takes the lock of a thread (its key is a 64-bit hash of the
schema and the thread id) on a connection of its own that stays open while the lease is
held. The database releases a session lock when its session ends, so a holder that dies —
SIGKILL, a lost machine — frees the lease without anyone cleaning up: at once when its
connection closes, and within about 15 seconds when the machine vanishes (TCP keepalives
and ``tcp_user_timeout`` are set on the lease's session). The holder writes who it is into
``roder_leases`` so a refused caller can name it.

A holder can lose its lease while it runs (the server restarts, ``pg_terminate_backend``,
a network cut): the lock goes with the session. So every append of a thread whose lease
this store holds is **fenced** in its own transaction (:meth:`AdvisoryLeases.fence`): the
``roder_leases`` row must still name this holder, and the advisory lock must still be held
by someone (a ``pg_try_advisory_xact_lock`` that succeeds means nobody holds it). Otherwise
the append raises ``LeaseLostError`` and writes nothing: once another session took the
thread over, or could have, nothing of the old holder lands. A child the holder forks (a tool's
background job) would keep the session's socket, and so the lock, past the holder's death:
the socket is replaced by ``/dev/null`` in forked children (``storekit.close_on_fork``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import psycopg

from roder_api.errors import LeaseLostError, StoreError, ThreadBusyError
from roder_api.storekit import close_on_fork, forget_on_fork, run_in_worker
from roder_api.threads import LeaseHolder, ThreadLease

LEASE_SESSION_OPTIONS = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
    "-c tcp_user_timeout=10000"
)
"""Server-side settings of a lease's session: a vanished holder is noticed within ~15 s."""


class AdvisoryLeases:
    """Leases of one schema's threads; ``connect`` opens a fresh autocommit connection."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        *,
        schema: str,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self._connect = connect
        self.schema = schema
        self._limiter = limiter
        self.held: dict[str, LeaseHolder] = {}
        """The leases held through this object now, by thread: what appends are fenced by."""

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        """Return a context manager holding the thread's lease while it is entered."""
        return self._lease(thread_id, owner)

    @asynccontextmanager
    async def _lease(self, thread_id: str, owner: str) -> AsyncIterator[ThreadLease]:
        holder = LeaseHolder.current(owner)
        # Shielded: a lock taken by the worker thread must never be lost to a cancellation.
        with anyio.CancelScope(shield=True):
            async with self._limiter or contextlib.nullcontext():
                conn = await run_in_worker(self._acquire, thread_id, holder)
        fd = conn.fileno()  # guarded since before the lock was taken
        self.held[thread_id] = holder
        try:
            yield ThreadLease(thread_id, holder)
        finally:
            self.held.pop(thread_id, None)
            forget_on_fork(fd)
            with anyio.CancelScope(shield=True):
                async with self._limiter or contextlib.nullcontext():
                    await run_in_worker(self._release, conn, thread_id, holder)

    def _key(self, thread_id: str) -> str:
        return f"roder-lease:{self.schema}:{thread_id}"

    def fence(self, conn: psycopg.Connection[Any], thread_id: str) -> None:
        """Raise ``LeaseLostError`` when this object held the thread's lease and lost it.

        Runs in the append's transaction (``conn``), so the check and the write are one
        step: the row must still name this holder (a new holder rewrote it) and the lock
        must be held (by the lease's session: taking it here means it was free). A lock
        taken here is a transaction lock, released when the transaction ends.
        """
        holder = self.held.get(thread_id)
        if holder is None:
            return  # not leased here: scripts and imports append without a lease
        row = conn.execute(
            "SELECT (SELECT pid = %s AND host = %s AND since_ms = %s FROM roder_leases"
            " WHERE thread_id = %s), pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
            (holder.pid, holder.host, holder.since_ms, thread_id, self._key(thread_id)),
        ).fetchone()
        ours, free = (row[0], row[1]) if row is not None else (None, True)
        if not ours:
            raise LeaseLostError(thread_id, "another session holds it now")
        if free:
            raise LeaseLostError(thread_id, "its PostgreSQL session ended")

    def _acquire(self, thread_id: str, holder: LeaseHolder) -> psycopg.Connection[Any]:
        try:
            return self._try_acquire(thread_id, holder)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot take the lease of thread {thread_id!r} in PostgreSQL schema "
                f"{self.schema!r}: {exc}"
            ) from exc

    def _try_acquire(self, thread_id: str, holder: LeaseHolder) -> psycopg.Connection[Any]:
        conn = self._connect()
        fd = conn.fileno()
        close_on_fork(fd)  # before the lock is taken: no fork can inherit it unguarded
        try:
            row = conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (self._key(thread_id),)
            ).fetchone()
            if row is None or not row[0]:
                raise ThreadBusyError(thread_id, self._holder(conn, thread_id))
            conn.execute(
                "INSERT INTO roder_leases (thread_id, owner, pid, host, since_ms) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (thread_id) DO UPDATE SET "
                "owner = excluded.owner, pid = excluded.pid, host = excluded.host, "
                "since_ms = excluded.since_ms",
                (thread_id, holder.owner, holder.pid, holder.host, holder.since_ms),
            )
        except BaseException:
            forget_on_fork(fd)
            conn.close()  # ends the session: releases the lock if it was taken
            raise
        return conn

    @staticmethod
    def _holder(conn: psycopg.Connection[Any], thread_id: str) -> LeaseHolder | None:
        row = conn.execute(
            "SELECT owner, pid, host, since_ms FROM roder_leases WHERE thread_id = %s",
            (thread_id,),
        ).fetchone()
        if row is None:
            return None
        return LeaseHolder(str(row[0]), int(row[1]), str(row[2]), int(row[3]))

    def _release(self, conn: psycopg.Connection[Any], thread_id: str, holder: LeaseHolder) -> None:
        try:
            conn.execute(
                "DELETE FROM roder_leases WHERE thread_id = %s AND pid = %s AND since_ms = %s "
                "AND host = %s",
                (thread_id, holder.pid, holder.since_ms, holder.host),
            )
            conn.execute(
                "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self._key(thread_id),)
            )
        except psycopg.Error:
            pass  # closing the connection below releases the lock all the same
        finally:
            conn.close()


__all__ = ["LEASE_SESSION_OPTIONS", "AdvisoryLeases"]
