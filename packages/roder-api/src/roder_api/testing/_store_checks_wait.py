"""Store checks: ``wait_for_events`` wakes on an append (same process and another)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api.errors import ThreadNotFoundError
from roder_api.testing._kit_support import make_metadata, new_thread_id, user_item
from roder_api.testing._store_checks_processes import ProcessChecks, _child, _finish, _line
from roder_api.threads import ThreadStore, ThreadStoreFactory

_WAKE_S = 10.0
"""How long a waiter may take to see an append (generous: the machine may be loaded)."""


class WaitChecks(ProcessChecks):
    """Checks of ``wait_for_events``: early return on an append, the timeout, not found."""

    async def test_wait_for_events_returns_at_timeout(self, thread_store: ThreadStore) -> None:
        """With nothing new it returns the last sequence after about ``timeout_s``."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(tid, [user_item("one")])
        started = anyio.current_time()
        assert await store.wait_for_events(tid, 1, 0.3) == 1
        waited = anyio.current_time() - started
        assert 0.25 <= waited < _WAKE_S, f"a 0.3 s wait took {waited:.2f} s"
        assert await store.wait_for_events(tid, 0, 5.0) == 1, "an old event did not count"

    async def test_wait_for_events_wakes_on_an_append(self, thread_store: ThreadStore) -> None:
        """A waiter returns soon after another task appends, with the new last sequence."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        seen: list[float] = []

        async def wait() -> None:
            assert await store.wait_for_events(tid, 0, 60.0) == 2
            seen.append(anyio.current_time())

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.2)
            appended = anyio.current_time()
            await store.append_events(tid, [user_item("a"), user_item("b")])
        assert seen and seen[0] - appended < _WAKE_S

    async def test_wait_for_events_is_woken_by_an_append_here_not_by_the_poll(
        self, thread_store: ThreadStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An append through the same store object in this process wakes a waiter at once
        (``notify_appended``), not at its next poll: with the poll's pauses at two minutes,
        the waiter still returns within seconds, with the new last sequence."""
        store = thread_store
        monkeypatch.setattr(store, "wait_poll_s", (120.0, 120.0))
        tid = (await store.create_thread(make_metadata())).thread_id
        waited: list[float] = []

        async def wait() -> None:
            started = anyio.current_time()
            assert await store.wait_for_events(tid, 0, 90.0) == 1
            waited.append(anyio.current_time() - started)

        with anyio.fail_after(100):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.5)  # the waiter has read the last sequence and sleeps
                await store.append_events(tid, [user_item("a")])
        assert waited and waited[0] < 30.0, f"woken after {waited[0]:.1f} s: by the poll"

    async def test_wait_for_events_on_a_missing_thread(self, thread_store: ThreadStore) -> None:
        """Waiting on a thread that does not exist raises ``ThreadNotFoundError``."""
        with pytest.raises(ThreadNotFoundError):
            await thread_store.wait_for_events(new_thread_id(), 0, 0.1)

    async def test_wait_for_events_wakes_on_another_process(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory, tmp_path: Path
    ) -> None:
        """A waiter in this process returns when another process appends."""
        factory_file = self._factory_file(thread_store_factory, tmp_path)
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        child = _child(factory_file, "append", tid, "p0", "1", stdin=True)
        assert await _line(child.stdout) == "ready\n", "the child did not open the store"
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                result: list[int] = []

                async def wait() -> None:
                    result.append(await store.wait_for_events(tid, 0, 60.0))

                tg.start_soon(wait)
                await anyio.sleep(0.2)
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
        await _finish(child)
        assert result == [1]
