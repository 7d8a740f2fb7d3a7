"""Store checks: metadata, listing, deletion, ids, concurrency and the store's lifetime."""

from __future__ import annotations

import anyio
import pytest

from roder_api.errors import (
    InvalidThreadIdError,
    StoppedError,
    ThreadExistsError,
    ThreadNotFoundError,
)
from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import (
    TokenUsage,
)
from roder_api.storekit import fold_metadata, listing_key, turns_from_events
from roder_api.testing._kit_support import (
    BAD_THREAD_IDS,
    all_threads,
    calls_with_id,
    check_batches,
    event_bytes,
    make_metadata,
    native_boundary,
    new_thread_id,
    now_ms,
    usage_event,
    user_item,
)
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadStore, ThreadStoreFactory
from roder_api.transcript import (
    AssistantMessage,
)


class ThreadChecks(StoreKitBase):
    """Checks of threads: metadata, listing, delete, ids, concurrency, reopen."""

    # --- metadata -------------------------------------------------------------------------

    async def test_metadata_usage_totals_and_counts(self, thread_store: ThreadStore) -> None:
        """Usage totals, item counts and times are folded from the journal and kept."""
        store = thread_store
        created = now_ms() - 60_000
        tid = (await store.create_thread(make_metadata(created_at_ms=created))).thread_id
        events: list[Event] = [
            TurnStarted("turn-1"),
            user_item("hello"),
            AssistantContentDelta("turn-1", "step-1", ContentPhase.FINAL_ANSWER, "hi"),
            ItemCompleted("turn-1", AssistantMessage("hi there")),
            usage_event(100, 20),
            UsageUpdated(None, TokenUsage(7, 3, 10, cached_prompt_tokens=4), "compaction"),
        ]
        await store.append_events(tid, events)
        await store.append_events(tid, [usage_event(1, 1, "turn-2"), user_item("x", "turn-2")])
        meta = await store.get_thread(tid)
        assert meta.usage == TokenUsage(108, 24, 132, cached_prompt_tokens=4)
        assert meta.item_count == 3
        assert meta.last_sequence == 8
        assert meta.created_at_ms == created
        assert meta.updated_at_ms >= created
        journal = await store.read_events(tid)
        base = make_metadata(tid, created_at_ms=created)
        folded = fold_metadata(base, journal)
        assert (folded.usage, folded.item_count, folded.last_sequence) == (
            meta.usage,
            meta.item_count,
            meta.last_sequence,
        )
        assert [len(t.items) for t in turns_from_events(journal)] == [2, 1]

        updated = await store.update_thread(tid, title="named", extra={"k": "v"})
        assert updated.title == "named" and dict(updated.extra) == {"k": "v"}
        assert updated.usage == meta.usage and updated.last_sequence == 8
        assert updated.updated_at_ms >= meta.updated_at_ms
        assert await store.get_thread(tid) == updated
        renamed = await store.update_thread(tid, title=None)
        assert renamed.title is None and dict(renamed.extra) == {"k": "v"}
        assert await store.update_thread(tid) == renamed
        listed = {m.thread_id: m for m in (await store.list_threads()).threads}
        assert listed[tid] == renamed, "the listing disagrees with get_thread"

    # --- listing --------------------------------------------------------------------------

    async def test_listing_newest_first_with_cursor(self, thread_store: ThreadStore) -> None:
        """Listings are newest update first (ties by id, descending) and page with a cursor."""
        store = thread_store
        assert (await store.list_threads()).threads == ()
        base = now_ms() - 1_000_000
        # Some share an update time, to check that ties page correctly too.
        times = [base + 10, base + 20, base + 20, base + 20, base + 30, base + 5, base + 40]
        for index, stamp in enumerate(times):
            await store.create_thread(make_metadata(f"list-{index}", created_at_ms=stamp))
        everything = await all_threads(store, limit=100)
        assert [m.thread_id for m in everything] == [
            m.thread_id for m in sorted(everything, key=listing_key, reverse=True)
        ]
        assert len(everything) == len(times)
        for limit in (1, 2, 3):
            paged = await all_threads(store, limit)
            assert [m.thread_id for m in paged] == [m.thread_id for m in everything]
        first = await store.list_threads(limit=3)
        assert [m.thread_id for m in first.threads] == ["list-6", "list-4", "list-3"]
        with pytest.raises(ValueError):
            await store.list_threads(limit=0)

    async def test_listing_cursor_is_stable_while_threads_change(
        self, thread_store: ThreadStore
    ) -> None:
        """Paging goes on from the cursor while threads are updated, created and deleted."""
        store = thread_store
        base = now_ms() - 1_000_000
        ids = [f"stable-{index:02d}" for index in range(10)]
        for index, tid in enumerate(ids):
            await store.create_thread(make_metadata(tid, created_at_ms=base + index * 10))
        first = await store.list_threads(limit=4)
        seen = [m.thread_id for m in first.threads]
        assert seen == ids[::-1][:4]
        # While the client pages: a listed thread and an unlisted one are updated (both
        # move to the front), a new thread appears, and an unlisted one is deleted.
        await store.append_events(seen[1], [user_item("bump")])
        await store.append_events(ids[2], [user_item("bump")])
        await store.create_thread(make_metadata("stable-new"))
        await store.delete_thread(ids[0])
        cursor = first.next_cursor
        assert cursor is not None
        while cursor is not None:
            page = await store.list_threads(cursor=cursor, limit=4)
            seen.extend(m.thread_id for m in page.threads)
            cursor = page.next_cursor
        assert len(seen) == len(set(seen)), f"a thread was listed twice: {seen}"
        untouched = [ids[index] for index in (1, 3, 4, 5)]
        for tid in untouched:
            assert tid in seen, f"{tid} was skipped while paging"
        assert ids[0] not in seen[4:]
        fresh = [m.thread_id for m in (await store.list_threads(limit=3)).threads]
        assert set(fresh) == {seen[1], ids[2], "stable-new"}

    # --- delete ---------------------------------------------------------------------------

    async def test_delete_thread(self, thread_store: ThreadStore) -> None:
        """A deleted thread is gone everywhere; its id can be used again."""
        store = thread_store
        keep = (await store.create_thread(make_metadata())).thread_id
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(tid, [user_item("a"), native_boundary(), user_item("b")])
        await store.append_events(keep, [user_item("kept")])
        await store.delete_thread(tid)
        assert not await store.thread_exists(tid)
        with pytest.raises(ThreadNotFoundError):
            await store.get_thread(tid)
        with pytest.raises(ThreadNotFoundError):
            await store.read_events(tid)
        with pytest.raises(ThreadNotFoundError):
            await store.replay_events(tid)
        with pytest.raises(ThreadNotFoundError):
            await store.delete_thread(tid)
        assert tid not in [m.thread_id for m in await all_threads(store, 50)]
        assert [e.sequence for e in await store.read_events(keep)] == [1]
        again = await store.create_thread(make_metadata(tid))
        assert again.last_sequence == 0
        assert await store.read_events(tid) == []
        assert await store.replay_events(tid) == []
        got = await store.append_events(tid, [user_item("new")])
        assert [e.sequence for e in got] == [1]
        assert [e.sequence for e in await store.replay_events(tid)] == [1]

    # --- ids ------------------------------------------------------------------------------

    async def test_invalid_thread_ids_are_refused(self, thread_store: ThreadStore) -> None:
        """Path tricks, control characters, empty and over-long ids are refused everywhere."""
        store = thread_store
        entry = JournalEvent(1, 1, user_item("x"))
        for bad in BAD_THREAD_IDS:
            with pytest.raises(InvalidThreadIdError):
                await store.create_thread(make_metadata(bad))
            for call in calls_with_id(store, bad, entry):
                with pytest.raises(InvalidThreadIdError):
                    await call()
        assert (await store.list_threads()).threads == ()
        longest = "a" * 128
        await store.create_thread(make_metadata(longest))
        await store.append_events(longest, [user_item("ok")])
        assert (await store.get_thread(longest)).last_sequence == 1

    # --- concurrency ----------------------------------------------------------------------

    async def test_concurrent_appends_to_one_thread(self, thread_store: ThreadStore) -> None:
        """Many tasks appending to one thread: no lost, duplicated or interleaved batch."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        returned: list[list[JournalEvent]] = []

        async def writer(task: int) -> None:
            for batch in range(self.batches_per_task):
                size = 1 + (task + batch) % 3
                events = [user_item(f"{task}:{batch}:{i}") for i in range(size)]
                returned.append(await store.append_events(tid, events))

        async with anyio.create_task_group() as tg:
            for task in range(self.concurrent_tasks):
                tg.start_soon(writer, task)
        check_batches(await store.read_events(tid), returned)
        meta = await store.get_thread(tid)
        assert meta.last_sequence == sum(len(b) for b in returned)
        assert meta.item_count == meta.last_sequence

    async def test_concurrent_appends_to_many_threads(self, thread_store: ThreadStore) -> None:
        """Many tasks appending to many threads (two writers per thread) at once."""
        store = thread_store
        tids = [(await store.create_thread(make_metadata())).thread_id for _ in range(8)]
        returned: dict[str, list[list[JournalEvent]]] = {tid: [] for tid in tids}

        async def writer(tid: str, task: int) -> None:
            for batch in range(self.batches_per_task):
                events = [user_item(f"{task}:{batch}:{i}") for i in range(2)]
                returned[tid].append(await store.append_events(tid, events))

        async with anyio.create_task_group() as tg:
            for index in range(self.concurrent_tasks):
                tg.start_soon(writer, tids[index % len(tids)], index)
        for tid in tids:
            check_batches(await store.read_events(tid), returned[tid])

    async def test_concurrent_creates_of_one_id(self, thread_store: ThreadStore) -> None:
        """Of many tasks creating the same thread at once, exactly one succeeds."""
        store = thread_store
        tid = new_thread_id()
        outcomes: list[str] = []

        async def create(index: int) -> None:
            try:
                await store.create_thread(make_metadata(tid, title=str(index)))
                outcomes.append("created")
            except ThreadExistsError:
                outcomes.append("exists")

        async with anyio.create_task_group() as tg:
            for index in range(8):
                tg.start_soon(create, index)
        assert sorted(outcomes) == ["created"] + ["exists"] * 7

    # --- lifetime -------------------------------------------------------------------------

    async def test_close_and_reopen_keeps_data(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Everything written is there after the store is closed and opened again."""
        store = await thread_store_factory.open()
        try:
            tid = (await store.create_thread(make_metadata(title="durable"))).thread_id
            await store.append_events(tid, [user_item("a"), usage_event(2, 3)])
            await store.append_events(tid, [native_boundary(), user_item("b")])
            await store.update_thread(tid, extra={"k": 1})
            meta = await store.get_thread(tid)
            journal = await store.read_events(tid)
            listing = await store.list_threads()
        finally:
            await store.aclose()
        with pytest.raises(StoppedError):
            await store.get_thread(tid)
        reopened = await thread_store_factory.open()
        try:
            assert await reopened.get_thread(tid) == meta
            assert event_bytes(await reopened.read_events(tid)) == event_bytes(journal)
            assert [e.sequence for e in await reopened.replay_events(tid)] == [3, 4]
            assert await reopened.list_threads() == listing
            got = await reopened.append_events(tid, [user_item("c")])
            assert [e.sequence for e in got] == [5]
        finally:
            await reopened.aclose()

    async def test_two_open_stores_share_threads(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Two store objects on the same data see each other's writes and order them."""
        first = await thread_store_factory.open()
        second = await thread_store_factory.open()
        try:
            tid = (await first.create_thread(make_metadata())).thread_id
            await first.append_events(tid, [user_item("one")])
            assert (await second.get_thread(tid)).last_sequence == 1
            got = await second.append_events(tid, [user_item("two")])
            assert [e.sequence for e in got] == [2]
            returned: list[list[JournalEvent]] = []

            async def writer(store: ThreadStore, task: int) -> None:
                for batch in range(self.batches_per_task):
                    events = [user_item(f"{task}:{batch}:{i}") for i in range(2)]
                    returned.append(await store.append_events(tid, events))

            async with anyio.create_task_group() as tg:
                for task in range(4):
                    tg.start_soon(writer, first if task % 2 else second, task)
            journal = await first.read_events(tid)
            check_batches(journal[2:], returned, first_sequence=3)
            assert event_bytes(await second.read_events(tid)) == event_bytes(journal)
            assert await first.get_thread(tid) == await second.get_thread(tid)
        finally:
            await first.aclose()
            await second.aclose()
