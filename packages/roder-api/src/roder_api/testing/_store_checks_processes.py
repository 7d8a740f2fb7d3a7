"""Store checks across real processes and on read-only stores; leases.

The cross-process checks open the store under test in child processes
(``roder_api.testing._kit_child``), from the picklable factory that
:meth:`StoreKitBase.child_process_factory` returns; they are skipped for a store that has
none (an in-memory store). The read-only check uses :meth:`StoreKitBase.read_only_factory`.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import anyio
import anyio.to_thread
import pytest

from roder_api.errors import InvalidThreadIdError, StoreError, ThreadBusyError, ThreadExistsError
from roder_api.events import Event
from roder_api.storekit import BlockingThreadStore, FollowOn, turns_from_events
from roder_api.testing._kit_support import (
    event_bytes,
    make_metadata,
    native_boundary,
    text_of,
    usage_event,
    user_item,
)
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadSnapshot, ThreadStore, ThreadStoreFactory


def _child(
    factory_file: Path, mode: str, thread_id: str, *args: str, stdin: bool = False
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    # The child imports the factory's class: give it this process's import path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen(
        [sys.executable, "-m", "roder_api.testing._kit_child", mode, str(factory_file)]
        + [thread_id, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def _line(stream: IO[str] | None, deadline_s: float = 60.0) -> str:
    assert stream is not None
    with anyio.fail_after(deadline_s):
        return await anyio.to_thread.run_sync(stream.readline, abandon_on_cancel=True)


async def _finish(proc: subprocess.Popen[str], deadline_s: float = 300.0) -> str:
    """Return the rest of a child's stdout once it exits; fail with its stderr otherwise."""

    def communicate() -> tuple[str, str]:
        return proc.communicate(timeout=deadline_s)

    try:
        out, err = await anyio.to_thread.run_sync(communicate)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"a child process did not finish within {deadline_s} s") from None
    assert proc.returncode == 0, f"a child process failed:\n{err}"
    return out


class ProcessChecks(StoreKitBase):
    """Conditional appends from two processes, leases across processes, read-only reads."""

    def _factory_file(self, factory: ThreadStoreFactory, tmp_path: Path) -> Path:
        spec = self.child_process_factory(factory)
        if spec is None:
            pytest.skip("the store cannot be opened from another process")
        path = tmp_path / "kit-factory.pickle"
        path.write_bytes(pickle.dumps(spec))
        return path

    async def test_conditional_appends_from_two_processes(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory, tmp_path: Path
    ) -> None:
        """Two processes race with conditional appends at full speed.

        Every append lands exactly once, right after the sequence it expected, or raises
        ``SequenceConflictError``; the journal has consecutive sequences and every landed
        event exactly once.
        """
        factory_file = self._factory_file(thread_store_factory, tmp_path)
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        count = self.cross_process_appends
        children = [
            _child(factory_file, "append", tid, f"p{n}", str(count), stdin=True) for n in range(2)
        ]
        # Both children open the store first and then start together: a child that
        # finished before the other began would race nobody.
        for child in children:
            assert await _line(child.stdout) == "ready\n", "a child did not open the store"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [await _finish(child) for child in children]
        landed: dict[str, tuple[int, int]] = {}
        for output in outputs:
            for line in output.splitlines():
                if line.startswith("landed "):
                    _, expected, sequence, text = line.split(" ", 3)
                    assert text not in landed, f"{text} was reported twice"
                    landed[text] = (int(expected), int(sequence))
        assert len(landed) == 2 * count, "a child did not get all its appends in"
        for text, (wanted, at) in landed.items():
            assert at == wanted + 1, (
                f"{text}: a conditional append expecting {wanted} landed at {at}: "
                "the check and the write are not one step across processes"
            )
        journal = await store.read_events(tid)
        assert [e.sequence for e in journal] == list(range(1, 2 * count + 1)), (
            "the journal's sequences are not consecutive"
        )
        assert {text_of(e): e.sequence for e in journal} == {
            text: sequence for text, (_, sequence) in landed.items()
        }, "the journal disagrees with the appends that landed"
        assert (await store.get_thread(tid)).last_sequence == 2 * count

    async def test_lease_is_held_by_one_holder(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """One holder at a time (also through another store object); freed on exit."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        other = await thread_store_factory.open()
        try:
            async with store.lease(tid, owner="kit-first") as lease:
                assert lease.thread_id == tid and lease.holder.owner == "kit-first"
                assert lease.holder.pid == os.getpid()
                for contender in (store, other):
                    with pytest.raises(ThreadBusyError) as info:
                        async with contender.lease(tid, owner="kit-second"):
                            raise AssertionError("a second holder got the lease")
                    assert info.value.thread_id == tid
                    assert info.value.holder is not None, "the refusal does not name the holder"
                    assert info.value.holder.owner == "kit-first"
                    assert "kit-first" in str(info.value)
                # Another thread's lease is independent.
                second = (await store.create_thread(make_metadata())).thread_id
                async with other.lease(second, owner="kit-second"):
                    pass
            async with other.lease(tid, owner="kit-second") as lease:
                assert lease.holder.owner == "kit-second"
            with pytest.raises(InvalidThreadIdError):
                async with store.lease("../x", owner="kit"):
                    pass
        finally:
            await other.aclose()

    async def test_lease_new_thread(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """``lease_new_thread`` makes the thread with its first events under its lease, held
        while entered and freed on exit; a taken id is refused, holding nothing."""
        store = thread_store
        meta = make_metadata()
        first: list[Event] = [user_item("hello", "t1")]
        other = await thread_store_factory.open()
        try:
            async with store.lease_new_thread(meta, first, owner="kit-maker") as made:
                assert made.lease.thread_id == meta.thread_id
                assert made.lease.holder.owner == "kit-maker"
                assert [entry.sequence for entry in made.entries] == [1]
                assert [entry.event for entry in made.entries] == first
                assert await store.read_events(meta.thread_id) == made.entries
                with pytest.raises(ThreadBusyError) as info:
                    async with other.lease(meta.thread_id, owner="kit-second"):
                        raise AssertionError("a second holder got a new thread's lease")
                assert info.value.holder is not None
                assert info.value.holder.owner == "kit-maker"
            async with other.lease(meta.thread_id, owner="kit-second"):
                pass  # freed on exit
            with pytest.raises(ThreadExistsError):
                async with store.lease_new_thread(meta, first, owner="kit-maker"):
                    raise AssertionError("a taken id was made again")
            async with other.lease(meta.thread_id, owner="kit-second"):
                pass  # the refused create held nothing
            assert await store.read_events(meta.thread_id) == made.entries
        finally:
            await other.aclose()

    async def test_lease_new_thread_with_a_follow_on(self, thread_store: ThreadStore) -> None:
        """The store kit's ``lease_new_thread(follow_on=...)``: of what is offered while the
        worker call runs (at each ``take`` and at the ``close``), what the entries hold
        follows the first events in order, each once, as journaled; the rest was refused
        (an override of ``create_with_follow_on_sync`` included)."""
        if not isinstance(thread_store, BlockingThreadStore):
            pytest.skip("not a store kit store (BlockingThreadStore): no follow_on")
        offered: list[Event] = []

        class Offering(FollowOn):
            def _add(self) -> None:  # as the event loop would, while the call runs
                event = user_item(f"offered {len(offered)}", "t1")
                if self.offer(event):
                    offered.append(event)

            def take(self) -> tuple[list[Event], list[bytes]]:
                self._add()
                return super().take()

            def close(self) -> tuple[list[Event], list[bytes]]:
                self._add()
                return super().close()

        follow_on = Offering()
        meta = make_metadata()
        first: list[Event] = [user_item("hello", "t1")]
        async with thread_store.lease_new_thread(
            meta, first, owner="kit-maker", follow_on=follow_on
        ) as made:
            assert follow_on.error is None, follow_on.error
            assert not follow_on.open, "the follow_on was left open"
            events = [entry.event for entry in made.entries]
            assert events[:1] == first
            assert events[1:] == offered[: len(events) - 1], "not what was offered, in order"
            assert [entry.sequence for entry in made.entries] == list(range(1, len(events) + 1))
            assert await thread_store.read_events(meta.thread_id) == made.entries

    async def test_lease_new_thread_across_processes(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory, tmp_path: Path
    ) -> None:
        """A new thread's lease taken with its create is refused to another process while
        held; an id whose lease another process holds is made nothing of, and no event."""
        factory_file = self._factory_file(thread_store_factory, tmp_path)
        store = thread_store
        meta = make_metadata()
        async with store.lease_new_thread(meta, [user_item("hi", "t1")], owner="kit-maker"):
            out = await _finish(_child(factory_file, "lease", meta.thread_id, "kit-child"), 60)
            assert out.startswith("busy ") and "kit-maker" in out, f"the child said {out!r}"
        taken = make_metadata()
        holder = _child(factory_file, "lease", taken.thread_id, "kit-child", stdin=True)
        try:
            line = await _line(holder.stdout)
            assert line.split() == ["held", str(holder.pid)], f"the child said {line!r}"
            with pytest.raises(ThreadBusyError) as info:
                async with store.lease_new_thread(taken, [user_item("hi", "t1")], owner="kit"):
                    raise AssertionError("a new thread was made under a lease held elsewhere")
            assert info.value.holder is not None and info.value.holder.owner == "kit-child"
            assert not await store.thread_exists(taken.thread_id)
        finally:
            await _finish(holder, 60)  # closes its stdin: the child lets go and exits

    async def test_lease_across_processes(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory, tmp_path: Path
    ) -> None:
        """A lease held by a child process is refused here naming it, and freed by SIGKILL."""
        factory_file = self._factory_file(thread_store_factory, tmp_path)
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        holder = _child(factory_file, "lease", tid, "kit-child", stdin=True)
        try:
            line = await _line(holder.stdout)
            assert line.split() == ["held", str(holder.pid)], f"the child said {line!r}"
            with pytest.raises(ThreadBusyError) as info:
                async with store.lease(tid, owner="kit-parent"):
                    raise AssertionError("the lease was given while a child held it")
            named = info.value.holder
            assert named is not None, "the refusal does not name the holder"
            assert (named.owner, named.pid) == ("kit-child", holder.pid)
            assert "kit-child" in str(info.value) and str(holder.pid) in str(info.value)
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(holder.communicate)
        with anyio.fail_after(self.lease_release_timeout_s):
            while True:
                try:
                    async with store.lease(tid, owner="kit-parent") as lease:
                        contender = _child(factory_file, "lease", tid, "kit-child-2")
                        out = await _finish(contender, 60)
                        assert out.startswith("busy "), f"a child got a held lease: {out!r}"
                        assert "kit-parent" in out and f"pid {lease.holder.pid}" in out
                    break
                except ThreadBusyError:
                    await anyio.sleep(0.1)  # the killed holder's lease is not free yet
        taker = _child(factory_file, "lease", tid, "kit-child-3", stdin=True)
        line = await _line(taker.stdout)
        assert line.split() == ["held", str(taker.pid)], "a released lease was not free"
        await _finish(taker, 60)  # closes its stdin: the child lets go and exits

    async def test_reads_on_a_read_only_store(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """A store opened read-only reads everything and refuses every write."""
        read_only = self.read_only_factory(thread_store_factory)
        if read_only is None:
            pytest.skip("the store has no read-only open")
        store = await thread_store_factory.open()
        try:
            tid = (await store.create_thread(make_metadata(title="ro"))).thread_id
            await store.append_events(tid, [user_item("a"), usage_event(1, 2)])
            await store.append_events(tid, [native_boundary(), user_item("b")])
            meta = await store.get_thread(tid)
            journal = await store.read_events(tid)
            listing = await store.list_threads()
        finally:
            await store.aclose()
        reader = await read_only.open()
        try:
            assert await reader.get_thread(tid) == meta
            assert event_bytes(await reader.read_events(tid)) == event_bytes(journal)
            assert [e.sequence for e in await reader.replay_events(tid)] == [3, 4]
            snapshot = await reader.read_snapshot(tid)
            assert snapshot == ThreadSnapshot(meta, turns_from_events(journal))
            page = await reader.event_page(tid, limit=2)
            assert [e.sequence for e in page.events] == [3, 4]
            assert await reader.list_threads() == listing
            for write in (
                lambda: reader.append_events(tid, [user_item("no")]),
                lambda: reader.create_thread(make_metadata()),
                lambda: reader.update_thread(tid, title="no"),
                lambda: reader.delete_thread(tid),
            ):
                with pytest.raises(StoreError):
                    await write()
        finally:
            await reader.aclose()
        again = await thread_store_factory.open()
        try:
            assert await again.get_thread(tid) == meta
            assert event_bytes(await again.read_events(tid)) == event_bytes(journal)
        finally:
            await again.aclose()
