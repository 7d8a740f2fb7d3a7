"""The JSONL store: journals, ids, paging, listing, and recovery from torn writes."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from roder_api.errors import (
    InvalidThreadIdError,
    StoreCorruptedError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
)
from roder_api.events import ItemCompleted, TurnStarted, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import ContextCompaction, ToolResultRecord, UserMessage
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


def meta(thread_id: str, title: str | None = None, at: int = 1000) -> ThreadMetadata:
    return ThreadMetadata(thread_id=thread_id, created_at_ms=at, updated_at_ms=at, title=title)


def msg(i: int) -> ItemCompleted:
    return ItemCompleted("turn", UserMessage(f"message {i}"))


async def test_append_assigns_consecutive_sequences_and_reads_in_order(
    jsonl_store: JsonlThreadStore,
) -> None:
    await jsonl_store.create_thread(meta("t1", "first"))
    first = await jsonl_store.append_events("t1", [TurnStarted("turn"), msg(1)])
    second = await jsonl_store.append_events("t1", [msg(2)])
    assert [e.sequence for e in first + second] == [1, 2, 3]
    events = await jsonl_store.read_events("t1")
    assert [e.event for e in events] == [TurnStarted("turn"), msg(1), msg(2)]
    assert [e.sequence for e in await jsonl_store.read_events("t1", after=1)] == [2, 3]
    assert [e.sequence for e in await jsonl_store.read_events("t1", limit=2)] == [1, 2]
    meta_now = await jsonl_store.get_thread("t1")
    assert meta_now.item_count == 2 and meta_now.last_sequence == 3
    assert meta_now.title == "first"


async def test_usage_totals_and_title_updates(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("u"))
    await jsonl_store.append_events("u", [UsageUpdated("t", TokenUsage(3, 1, 4, 2))])
    await jsonl_store.append_events("u", [UsageUpdated("t", TokenUsage(5, 5, 10))])
    updated = await jsonl_store.update_thread("u", title="renamed", extra={"k": 1})
    assert updated.usage == TokenUsage(8, 6, 14, 2)
    assert updated.title == "renamed" and updated.extra == {"k": 1}


async def test_event_page_pages_backwards(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("p"))
    for i in range(7):
        await jsonl_store.append_events("p", [msg(i)])
    page = await jsonl_store.event_page("p", limit=3)
    assert [e.sequence for e in page.events] == [5, 6, 7] and page.next_before == 5
    page = await jsonl_store.event_page("p", before=page.next_before, limit=3)
    assert [e.sequence for e in page.events] == [2, 3, 4] and page.next_before == 2
    page = await jsonl_store.event_page("p", before=2, limit=3)
    assert [e.sequence for e in page.events] == [1] and page.next_before is None


async def test_replay_starts_at_the_last_boundary(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("r"))
    await jsonl_store.append_events("r", [msg(1), msg(2)])
    await jsonl_store.append_events(
        "r", [msg(3), ItemCompleted("turn", ContextCompaction("sum")), msg(4)]
    )
    await jsonl_store.append_events("r", [msg(5)])
    replay = await jsonl_store.replay_events("r")
    assert [e.sequence for e in replay] == [4, 5, 6]


async def test_listing_is_newest_first_with_a_cursor(jsonl_store: JsonlThreadStore) -> None:
    for i in range(5):
        await jsonl_store.create_thread(meta(f"th{i}", at=1000 + i))
    page = await jsonl_store.list_threads(limit=2)
    assert [m.thread_id for m in page.threads] == ["th4", "th3"]
    page = await jsonl_store.list_threads(cursor=page.next_cursor, limit=2)
    assert [m.thread_id for m in page.threads] == ["th2", "th1"]
    page = await jsonl_store.list_threads(cursor=page.next_cursor, limit=2)
    assert [m.thread_id for m in page.threads] == ["th0"] and page.next_cursor is None
    await jsonl_store.append_events("th0", [msg(0)])
    page = await jsonl_store.list_threads(limit=1)
    assert page.threads[0].thread_id == "th0"


async def test_create_exists_delete(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("d"))
    with pytest.raises(ThreadExistsError):
        await jsonl_store.create_thread(meta("d"))
    assert await jsonl_store.thread_exists("d")
    await jsonl_store.delete_thread("d")
    assert not await jsonl_store.thread_exists("d")
    with pytest.raises(ThreadNotFoundError):
        await jsonl_store.delete_thread("d")
    with pytest.raises(ThreadNotFoundError):
        await jsonl_store.append_events("d", [msg(1)])
    with pytest.raises(ThreadNotFoundError):
        await jsonl_store.read_events("nope")


@pytest.mark.parametrize(
    "bad_id",
    ["../x", "/etc/passwd", "", "a\x00b", "a\nb", "x" * 129, ".hidden", "a/b", "-x", "ä", "a b"],
)
async def test_bad_thread_ids_are_refused_and_touch_nothing(
    jsonl_factory: JsonlThreadStoreFactory, bad_id: str
) -> None:
    store = await jsonl_factory.open()
    before = sorted(p.name for p in jsonl_factory.base_path.rglob("*"))
    with pytest.raises(InvalidThreadIdError):
        await store.create_thread(meta(bad_id))
    for call in (
        store.get_thread(bad_id),
        store.append_events(bad_id, [msg(1)]),
        store.read_events(bad_id),
        store.delete_thread(bad_id),
    ):
        with pytest.raises(InvalidThreadIdError):
            await call
    assert sorted(p.name for p in jsonl_factory.base_path.rglob("*")) == before
    assert not (jsonl_factory.base_path.parent / "x.jsonl").exists()


async def test_longest_valid_id_works(jsonl_store: JsonlThreadStore) -> None:
    thread_id = "A" + "b.-_9" * 25 + "xy"
    assert len(thread_id) == 128
    await jsonl_store.create_thread(meta(thread_id))
    assert (await jsonl_store.get_thread(thread_id)).thread_id == thread_id


async def test_unserializable_batch_stores_nothing(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("s"))
    bad = ItemCompleted("t", ToolResultRecord("1", "tool", "r", display_payload=object()))
    with pytest.raises(UnserializableEventError):
        await jsonl_store.append_events("s", [msg(1), bad])
    assert await jsonl_store.read_events("s") == []
    assert [e.sequence for e in await jsonl_store.append_events("s", [msg(2)])] == [1]


async def test_data_survives_a_new_store_object(jsonl_factory: JsonlThreadStoreFactory) -> None:
    store = await jsonl_factory.open()
    await store.create_thread(meta("k"))
    await store.append_events("k", [msg(1), UsageUpdated("t", TokenUsage(1, 1, 2))])
    await store.aclose()
    store = await jsonl_factory.open()
    assert [e.event for e in await store.read_events("k")][0] == msg(1)
    assert (await store.get_thread("k")).usage.total_tokens == 2
    assert [e.sequence for e in await store.append_events("k", [msg(2)])] == [3]


async def unacknowledged_line(
    factory: JsonlThreadStoreFactory, thread_id: str, event: ItemCompleted
) -> bytes:
    """Return the journal line an append of ``event`` writes, without appending it here.

    Appended to a copy of the store: this store's index never hears of it, as of a write
    a crash cut short before it was acknowledged (a line the index knows is damage if torn).
    """
    copy = factory.base_path.with_name(factory.base_path.name + "-copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(factory.base_path, copy)
    other = await JsonlThreadStoreFactory(base_path=copy).open()
    async with other:
        before = other.journal_path(thread_id).read_bytes()
        await other.append_events(thread_id, [event])
        line = other.journal_path(thread_id).read_bytes()[len(before) :]
    shutil.rmtree(copy)
    return line


async def test_torn_last_line_is_cut_and_earlier_events_survive(
    jsonl_factory: JsonlThreadStoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = await jsonl_factory.open()
    await store.create_thread(meta("torn"))
    for i in range(3):
        await store.append_events("torn", [msg(i)])
    path = store.journal_path("torn")
    whole = path.read_bytes()
    last = await unacknowledged_line(jsonl_factory, "torn", msg(99))
    # A crash mid-write: half of a line never acknowledged (nor indexed) reached the disk.
    path.write_bytes(whole + last[: len(last) // 2])
    store = await jsonl_factory.open()
    assert [e.sequence for e in await store.read_events("torn")] == [1, 2, 3]
    with caplog.at_level(logging.WARNING, logger="roder.jsonl"):
        appended = await store.append_events("torn", [msg(4)])
    assert appended[0].sequence == 4
    assert "cut a torn last line" in caplog.text and "bytes moved to" in caplog.text
    events = await store.read_events("torn")
    assert [e.event for e in events] == [msg(0), msg(1), msg(2), msg(4)]
    assert path.read_bytes().startswith(whole)


async def test_an_unterminated_last_line_is_a_torn_write_moved_aside_by_the_next_write(
    jsonl_factory: JsonlThreadStoreFactory,
) -> None:
    store = await jsonl_factory.open()
    await store.create_thread(meta("nl"))
    path = store.journal_path("nl")
    line = await unacknowledged_line(jsonl_factory, "nl", msg(1))
    torn = path.read_bytes() + line[:-1]
    path.write_bytes(torn)  # the commit's one write lost its last byte: never acknowledged
    store = await jsonl_factory.open()
    assert await store.read_events("nl") == []
    await store.append_events("nl", [msg(2)])
    assert [e.event for e in await store.read_events("nl")] == [msg(2)]
    (quarantine,) = path.parent.glob("nl.jsonl.quarantine-*")
    assert (
        path.read_bytes()[: len(torn) - len(quarantine.read_bytes())] + (quarantine.read_bytes())
        == torn
    )


async def test_mid_file_damage_is_refused_and_not_cut(
    jsonl_factory: JsonlThreadStoreFactory,
) -> None:
    store = await jsonl_factory.open()
    await store.create_thread(meta("mid"))
    for i in range(3):
        await store.append_events("mid", [msg(i)])
    path = store.journal_path("mid")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b"message 1", b"messagX 1")
    damaged = b"\n".join(lines)
    path.write_bytes(damaged)
    store = await jsonl_factory.open()
    with pytest.raises(StoreCorruptedError) as info:
        await store.read_events("mid")
    assert info.value.line == 3 and str(path) in str(info.value)
    with pytest.raises(StoreCorruptedError):
        await store.append_events("mid", [msg(5)])
    assert path.read_bytes() == damaged


async def test_a_newer_format_version_is_refused(jsonl_factory: JsonlThreadStoreFactory) -> None:
    from roder_jsonl_thread_store._format import encode_record

    store = await jsonl_factory.open()
    await store.create_thread(meta("v"))
    path = store.journal_path("v")
    newer = encode_record({"v": 2, "k": "events", "seq": 1, "t": 1, "events": []})
    path.write_bytes(path.read_bytes() + newer)
    store = await jsonl_factory.open()
    with pytest.raises(StoreError, match="newer Roder"):
        await store.read_events("v")
    with pytest.raises(StoreError, match="newer Roder"):
        await store.read_snapshot("v")


async def test_closed_store_refuses_work(jsonl_store: JsonlThreadStore) -> None:
    from roder_api.errors import StoppedError

    await jsonl_store.aclose()
    with pytest.raises(StoppedError):
        await jsonl_store.list_threads()


async def test_journal_file_name_contains_the_thread_id(jsonl_store: JsonlThreadStore) -> None:
    await jsonl_store.create_thread(meta("named-thread"))
    names = os.listdir(jsonl_store.threads_dir)
    assert any("named-thread" in n for n in names)
    assert isinstance(jsonl_store.journal_path("named-thread"), Path)
