"""Store checks: the conditional append (``expected_last_sequence``), within one process."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from roder_api.errors import SequenceConflictError, ThreadNotFoundError
from roder_api.events import JournalEvent
from roder_api.testing._kit_support import (
    event_bytes,
    make_metadata,
    new_thread_id,
    text_of,
    usage_event,
    user_item,
)
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadStore


class ConditionalAppendChecks(StoreKitBase):
    """Checks of ``append_events(..., expected_last_sequence=N)``."""

    async def test_conditional_append(self, thread_store: ThreadStore) -> None:
        """A conditional append lands only on the expected last sequence; else nothing."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        first = await store.append_events(tid, [user_item("a")], expected_last_sequence=0)
        assert [e.sequence for e in first] == [1]
        meta = await store.get_thread(tid)
        with pytest.raises(SequenceConflictError) as info:
            await store.append_events(
                tid, [user_item("late"), usage_event(1, 1)], expected_last_sequence=0
            )
        assert (info.value.expected, info.value.actual) == (0, 1)
        assert info.value.thread_id == tid
        with pytest.raises(SequenceConflictError) as info:
            await store.append_events(tid, [user_item("ahead")], expected_last_sequence=5)
        assert (info.value.expected, info.value.actual) == (5, 1)
        assert [e.sequence for e in await store.read_events(tid)] == [1], (
            "a refused conditional append wrote events"
        )
        assert await store.get_thread(tid) == meta, "a refused conditional append changed it"
        got = await store.append_events(
            tid, [user_item("b"), user_item("c")], expected_last_sequence=1
        )
        assert [e.sequence for e in got] == [2, 3]
        plain = await store.append_events(tid, [user_item("d")], expected_last_sequence=None)
        assert [e.sequence for e in plain] == [4]
        assert [text_of(e) for e in await store.read_events(tid)] == ["a", "b", "c", "d"]
        assert (await store.get_thread(tid)).last_sequence == 4
        with pytest.raises(ThreadNotFoundError):
            await store.append_events(
                new_thread_id("missing"), [user_item("x")], expected_last_sequence=0
            )

    async def test_conditional_append_after_import(self, thread_store: ThreadStore) -> None:
        """The expected sequence counts imported events like appended ones."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.import_events(
            tid, [JournalEvent(1, 1, user_item("a")), JournalEvent(2, 2, user_item("b"))]
        )
        with pytest.raises(SequenceConflictError) as info:
            await store.append_events(tid, [user_item("x")], expected_last_sequence=1)
        assert info.value.actual == 2
        got = await store.append_events(tid, [user_item("c")], expected_last_sequence=2)
        assert [e.sequence for e in got] == [3]

    async def test_concurrent_conditional_appends(self, thread_store: ThreadStore) -> None:
        """Tasks racing with conditional appends: each expected sequence is won once.

        Every task reads the thread's last sequence and appends on it, again on a conflict.
        An append that lands must land right after the sequence it expected, and the
        journal must hold each landed batch exactly once.
        """
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        landed: list[tuple[int, list[JournalEvent]]] = []
        conflicts = 0

        async def writer(task: int) -> None:
            nonlocal conflicts
            for batch in range(self.batches_per_task):
                events = [user_item(f"{task}:{batch}:{i}") for i in range(1 + batch % 2)]
                for _attempt in range(1000):
                    expected = (await store.get_thread(tid)).last_sequence
                    try:
                        got = await store.append_events(
                            tid, events, expected_last_sequence=expected
                        )
                    except SequenceConflictError as exc:
                        assert exc.expected == expected and exc.actual != expected
                        conflicts += 1
                        await anyio.lowlevel.checkpoint()
                        continue
                    landed.append((expected, got))
                    break
                else:
                    raise AssertionError("a writer never got its conditional append in")

        async with anyio.create_task_group() as tg:
            for task in range(self.concurrent_tasks):
                tg.start_soon(writer, task)
        for expected, got in landed:
            assert got[0].sequence == expected + 1, (
                f"a conditional append expecting {expected} landed at {got[0].sequence}: "
                "the check and the write are not one step"
            )
        journal = await store.read_events(tid)
        total = sum(len(got) for _, got in landed)
        assert [e.sequence for e in journal] == list(range(1, total + 1))
        by_sequence = {e.sequence: e for e in journal}
        assert event_bytes([by_sequence[e.sequence] for _, got in landed for e in got]) == (
            event_bytes([e for _, got in landed for e in got])
        ), "the journal disagrees with what the conditional appends returned"
        texts = [text_of(e) for e in journal]
        assert len(texts) == len(set(texts)), "a batch landed twice"
