"""The JSONL store's index, paging, replay offsets and group commit."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from jsonl_helpers import msg

from roder_api.events import ItemCompleted, JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import ContextCompaction
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def long_thread(store: JsonlThreadStore, thread_id: str, count: int) -> None:
    await store.create_thread(ThreadMetadata(thread_id, 1000, 1000))
    entries = [JournalEvent(i + 1, 2000 + i, msg(i + 1, 120)) for i in range(count)]
    for start in range(0, count, 500):
        await store.import_events(thread_id, entries[start : start + 500])


async def test_listing_and_metadata_come_from_the_index_after_reopening(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    for i in range(7):
        await store.create_thread(ThreadMetadata(f"t{i}", 1000 + i, 1000 + i, title=f"n{i}"))
    await store.append_events("t2", [msg(1), UsageUpdated("turn", TokenUsage(3, 2, 5))])
    await store.update_thread("t5", title="renamed")
    expected = [await store.get_thread(f"t{i}") for i in range(7)]
    await store.aclose()
    store = await factory.open()
    seen = []
    cursor = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=3)
        seen.extend(page.threads)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert [m.thread_id for m in seen[:2]] == ["t5", "t2"]  # updated last, newest first
    assert sorted(seen, key=lambda m: m.thread_id) == expected
    t2 = next(m for m in seen if m.thread_id == "t2")
    assert t2.usage.total_tokens == 5 and t2.item_count == 1 and t2.last_sequence == 2
    await store.aclose()


async def test_the_cursor_is_stable_when_threads_change_between_pages(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    for i in range(6):
        await store.create_thread(ThreadMetadata(f"c{i}", 1000 + i, 1000 + i))
    first = await store.list_threads(limit=3)
    assert [m.thread_id for m in first.threads] == ["c5", "c4", "c3"]
    await store.append_events("c0", [msg(1)])  # moves to the front: not repeated below
    second = await store.list_threads(cursor=first.next_cursor, limit=3)
    assert [m.thread_id for m in second.threads] == ["c2", "c1"]
    assert second.next_cursor is None
    await store.aclose()


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
async def test_a_missing_or_unreadable_index_is_rebuilt_from_the_journals(
    factory: JsonlThreadStoreFactory, damage: str
) -> None:
    store = await factory.open()
    for i in range(3):
        await store.create_thread(ThreadMetadata(f"r{i}", 1000 + i, 1000 + i))
    await store.append_events("r0", [msg(1)])
    await store.aclose()
    index = factory.base_path / "index.sqlite3"
    for suffix in ("-wal", "-shm"):
        Path(str(index) + suffix).unlink(missing_ok=True)  # noqa: ASYNC240 - test setup
    if damage == "deleted":
        index.unlink()  # noqa: ASYNC240 - test setup
    else:
        index.write_bytes(b"this is not a database" * 100)
    store = await factory.open()
    page = await store.list_threads()
    assert [m.thread_id for m in page.threads] == ["r0", "r2", "r1"]
    assert page.threads[0].item_count == 1
    await store.aclose()
    # Damage is kept for a look: the unreadable file is set aside, never deleted.
    aside = sorted(p.name for p in factory.base_path.glob("index.sqlite3.bad-*"))
    assert len(aside) == (damage == "garbage"), aside


async def test_a_journal_that_grew_behind_the_index_is_caught_up_by_reading_its_tail(
    factory: JsonlThreadStoreFactory,
) -> None:
    first = await factory.open()
    await first.create_thread(ThreadMetadata("g", 1000, 1000))
    second = await factory.open()
    assert (await second.get_thread("g")).last_sequence == 0
    await first.append_events("g", [msg(1), msg(2)])
    # The other store object remembers the old size and reads only what was added.
    assert (await second.get_thread("g")).last_sequence == 2
    assert [e.sequence for e in await second.read_events("g")] == [1, 2]
    await first.aclose()
    await second.aclose()


async def test_event_pages_and_reads_after_a_sequence_in_a_long_journal(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    await long_thread(store, "long", 2000)
    store = await factory.open()  # fresh: the journal is found through the index
    everything = await store.read_events("long")
    assert [e.sequence for e in everything] == list(range(1, 2001))
    for after in (0, 1, 17, 999, 1500, 1999, 2000, 2500):
        got = await store.read_events("long", after=after, limit=7)
        assert got == everything[after : after + 7]
    before = None
    collected: list[JournalEvent] = []
    while True:
        page = await store.event_page("long", before=before, limit=150)
        assert [e.sequence for e in page.events] == sorted(e.sequence for e in page.events)
        collected = list(page.events) + collected
        before = page.next_before
        if before is None:
            break
    assert collected == everything
    page = await store.event_page("long", before=1234, limit=5)
    assert [e.sequence for e in page.events] == [1229, 1230, 1231, 1232, 1233]
    assert page.next_before == 1229
    page = await store.event_page("long", before=99999, limit=2)
    assert [e.sequence for e in page.events] == [1999, 2000]
    await store.aclose()


async def test_replay_starts_at_the_remembered_boundary_in_a_fresh_store(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    await long_thread(store, "b", 1000)
    await store.append_events("b", [msg(1), ItemCompleted("t", ContextCompaction("s")), msg(2)])
    await store.append_events("b", [msg(3)])
    await store.aclose()
    store = await factory.open()
    replay = await store.replay_events("b")
    assert [e.sequence for e in replay] == [1002, 1003, 1004]
    assert replay[0].event == ItemCompleted("t", ContextCompaction("s"))
    await store.aclose()


@pytest.mark.parametrize("threads", [1, 8])
async def test_group_commit_gives_every_task_its_own_consecutive_sequences(
    factory: JsonlThreadStoreFactory, threads: int
) -> None:
    group_factory = JsonlThreadStoreFactory(factory.base_path, durability="group")
    store = await group_factory.open()
    for t in range(threads):
        await store.create_thread(ThreadMetadata(f"g{t}", 1000, 1000))
    returned: dict[str, list[int]] = {f"g{t}": [] for t in range(threads)}

    async def writer(task: int) -> None:
        thread_id = f"g{task % threads}"
        for i in range(20):
            batch = [msg(task * 100 + i), msg(task * 100 + i)]
            got = await store.append_events(thread_id, batch)
            assert [e.sequence for e in got] == [got[0].sequence, got[0].sequence + 1]
            returned[thread_id].extend(e.sequence for e in got)

    async with anyio.create_task_group() as group:
        for task in range(32):
            group.start_soon(writer, task)
    await store.aclose()
    store = await factory.open()
    for thread_id, sequences in returned.items():
        events = await store.read_events(thread_id)
        assert sorted(sequences) == [e.sequence for e in events] == list(range(1, len(events) + 1))
        assert (await store.get_thread(thread_id)).last_sequence == len(events)
    await store.aclose()


async def test_group_commit_failures_stay_with_their_own_commit(
    factory: JsonlThreadStoreFactory,
) -> None:
    from roder_api.errors import SequenceConflictError, ThreadNotFoundError

    store = await JsonlThreadStoreFactory(factory.base_path, durability="group").open()
    await store.create_thread(ThreadMetadata("ok", 1000, 1000))
    results: dict[str, object] = {}

    async def attempt(name: str, coro: object) -> None:
        try:
            results[name] = await coro  # type: ignore[misc]
        except Exception as exc:
            results[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(attempt, "good", store.append_events("ok", [msg(1)]))
        group.start_soon(attempt, "missing", store.append_events("nope", [msg(1)]))
        group.start_soon(
            attempt, "conflict", store.import_events("ok", [JournalEvent(7, 1, msg(7))])
        )
        group.start_soon(attempt, "good2", store.append_events("ok", [msg(2)]))
    assert isinstance(results["missing"], ThreadNotFoundError)
    assert isinstance(results["conflict"], SequenceConflictError)
    assert [e.sequence for e in await store.read_events("ok")] == [1, 2]
    await store.aclose()


async def test_a_created_thread_is_what_a_fresh_store_reads_back_and_appends_continue_it(
    factory: JsonlThreadStoreFactory,
) -> None:
    # create_thread builds the new journal's state from the line it wrote (no rescan):
    # what it returns, and what the first append continues from, must be what a scan gives.
    store = await factory.open()
    extra = {"nested": {"list": [1, 2.5, "x", None, True]}, "n": 3}
    created = await store.create_thread(
        ThreadMetadata("fresh", 1000, 1001, title="a title", extra=extra)
    )
    (entry,) = await store.append_events("fresh", [msg(1)])
    after_append = await store.get_thread("fresh")
    await store.aclose()
    reopened = await factory.open()
    (listed,) = (await reopened.list_threads()).threads
    assert created == ThreadMetadata("fresh", 1000, 1001, title="a title", extra=extra)
    assert entry.sequence == 1
    assert listed == after_append == await reopened.get_thread("fresh")
    assert listed.item_count == 1 and listed.last_sequence == 1
    assert [e.event for e in await reopened.read_events("fresh")] == [msg(1)]
    assert not list((factory.base_path / "tmp").iterdir())  # no temporary file left behind
    await reopened.aclose()


async def test_group_committed_rows_reach_the_index_without_a_catch_up(
    factory: JsonlThreadStoreFactory, tmp_path: Path
) -> None:
    # Group commit writes a batch's index row after waking its callers: a listing right
    # after sees it, another store object sees it, and the store closes with its session
    # ended (no catch-up for the next opener).
    store = await factory.open()
    await store.create_thread(ThreadMetadata("a", 1000, 1000))
    await store.create_thread(ThreadMetadata("b", 1001, 1001))
    for i in range(5):
        await store.append_events("a", [msg(i + 1)])
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(store.append_events, "b", [msg(i + 1)])
    page = await store.list_threads()
    assert [(m.thread_id, m.item_count) for m in page.threads] == [("b", 20), ("a", 5)]
    other = await factory.open()
    assert [m.item_count for m in (await other.list_threads()).threads] == [20, 5]
    await other.aclose()
    await store.aclose()
    assert not list((tmp_path / "store" / "sessions").glob("*")), "a session left behind"


async def test_a_deferred_row_reaches_another_store_without_a_read_or_close_here(
    factory: JsonlThreadStoreFactory,
) -> None:
    # Back-to-back appends leave the last rows for a timer (at most every
    # INDEX_FLUSH_INTERVAL_S): another store object (another process, say) lists them soon,
    # though this one never reads; until the create's row is written it lists nothing.
    store = await factory.open()
    await store.create_thread(ThreadMetadata("a", 1000, 1000))
    for i in range(30):
        await store.append_events("a", [msg(i + 1)])
    other = await factory.open()
    counts: list[int] = []
    with anyio.move_on_after(10):
        while counts[-1:] != [30]:
            listed = (await other.list_threads()).threads
            counts.append(listed[0].item_count if listed else 0)
            await anyio.sleep(0.01)
    assert counts[-1] == 30
    await other.aclose()
    await store.aclose()
