"""Store checks: creating threads, appending, reading, paging, replay, import, content."""

from __future__ import annotations

import pytest

from roder_api.codec import to_dict
from roder_api.errors import (
    SequenceConflictError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
)
from roder_api.events import (
    Event,
    ItemCompleted,
    JournalEvent,
)
from roder_api.inference import (
    TokenUsage,
)
from roder_api.storekit import turns_from_events
from roder_api.testing._kit_support import (
    event_bytes,
    make_metadata,
    native_boundary,
    new_thread_id,
    now_ms,
    text_of,
    unserializable_event,
    usage_event,
    user_item,
)
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadSnapshot, ThreadStore
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    UserMessage,
    is_compaction_boundary,
)


class JournalChecks(StoreKitBase):
    """Checks of the journal: create, append, read, page, replay, import, content."""

    # --- create, exists, not found --------------------------------------------------------

    async def test_create_get_and_exists(self, thread_store: ThreadStore) -> None:
        """A created thread can be read back; a missing one is reported as missing."""
        store = thread_store
        created_at = now_ms() - 5000
        meta = make_metadata(
            title="first",
            extra={"forked_from": "x", "n": [1, 2]},
            created_at_ms=created_at,
            # The journal's own fold decides these, not the caller:
            usage=TokenUsage(1, 2, 3),
            item_count=7,
            last_sequence=9,
        )
        stored = await store.create_thread(meta)
        assert stored.thread_id == meta.thread_id
        assert stored.title == "first"
        assert dict(stored.extra) == {"forked_from": "x", "n": [1, 2]}
        assert stored.created_at_ms == created_at
        assert stored.last_sequence == 0 and stored.item_count == 0
        assert stored.usage == TokenUsage()
        assert await store.get_thread(meta.thread_id) == stored
        assert await store.thread_exists(meta.thread_id)
        assert await store.read_events(meta.thread_id) == []
        assert await store.replay_events(meta.thread_id) == []

        with pytest.raises(ThreadExistsError):
            await store.create_thread(make_metadata(meta.thread_id))
        assert await store.get_thread(meta.thread_id) == stored

        missing = new_thread_id("missing")
        assert not await store.thread_exists(missing)
        with pytest.raises(ThreadNotFoundError) as info:
            await store.get_thread(missing)
        assert info.value.thread_id == missing
        with pytest.raises(ThreadNotFoundError):
            await store.append_events(missing, [user_item("hi")])
        with pytest.raises(ThreadNotFoundError):
            await store.read_events(missing)
        with pytest.raises(ThreadNotFoundError):
            await store.update_thread(missing, title="x")
        with pytest.raises(ThreadNotFoundError):
            await store.import_events(missing, [JournalEvent(1, 1, user_item("hi"))])
        assert not await store.thread_exists(missing)

    # --- appending ------------------------------------------------------------------------

    async def test_create_with_events(self, thread_store: ThreadStore) -> None:
        """``create_thread_with_events`` makes a thread holding its first events (sequences
        from 1, folded into its metadata); a taken id is refused, the thread untouched."""
        store = thread_store
        meta = make_metadata(title="made with")
        first: list[Event] = [user_item("hello", "t1"), usage_event(3, 4, "t1")]
        entries = await store.create_thread_with_events(meta, first)
        assert [e.sequence for e in entries] == [1, 2]
        assert [e.event for e in entries] == first
        assert await store.read_events(meta.thread_id) == entries
        stored = await store.get_thread(meta.thread_id)
        assert stored.title == "made with"
        assert (stored.last_sequence, stored.item_count) == (2, 1)
        with pytest.raises(ThreadExistsError):
            await store.create_thread_with_events(make_metadata(meta.thread_id), first)
        assert await store.read_events(meta.thread_id) == entries
        empty = make_metadata()
        assert await store.create_thread_with_events(empty, []) == []
        assert (await store.get_thread(empty.thread_id)).last_sequence == 0
        after = await store.append_events(meta.thread_id, [user_item("x", "t2")])
        assert after[0].sequence == 3

    async def test_append_assigns_consecutive_sequences(self, thread_store: ThreadStore) -> None:
        """Batches get consecutive sequence numbers from 1 and read back as returned."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        before = now_ms()
        returned: list[JournalEvent] = []
        for size in (1, 3, 2):
            batch = [user_item(f"m{len(returned) + i}") for i in range(size)]
            got = await store.append_events(tid, batch)
            assert [e.event for e in got] == batch
            returned.extend(got)
        assert [e.sequence for e in returned] == [1, 2, 3, 4, 5, 6]
        assert all(before - 1000 <= e.recorded_at_ms <= now_ms() + 1000 for e in returned)
        assert await store.append_events(tid, []) == []
        read = await store.read_events(tid)
        assert event_bytes(read) == event_bytes(returned)
        assert (await store.get_thread(tid)).last_sequence == 6

    async def test_batch_append_is_atomic(self, thread_store: ThreadStore) -> None:
        """A batch with an unserialisable event raises and stores nothing of the batch."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(tid, [user_item("before")])
        meta = await store.get_thread(tid)
        bad_batch: list[Event] = [user_item("a"), usage_event(5, 5), unserializable_event()]
        with pytest.raises(UnserializableEventError):
            await store.append_events(tid, bad_batch)
        with pytest.raises(UnserializableEventError):
            await store.append_events(tid, [unserializable_event(), user_item("b")])
        after = await store.read_events(tid)
        assert [e.sequence for e in after] == [1], "a failed batch left events behind"
        assert await store.get_thread(tid) == meta, "a failed batch changed the metadata"
        got = await store.append_events(tid, [user_item("next"), user_item("next2")])
        assert [e.sequence for e in got] == [2, 3], "a failed batch left a gap or a duplicate"

    async def test_read_events_after_and_limit(self, thread_store: ThreadStore) -> None:
        """``read_events`` returns the events above ``after``, in order, at most ``limit``."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(tid, [user_item(f"m{i}") for i in range(1, 11)])
        assert [e.sequence for e in await store.read_events(tid, after=3)] == list(range(4, 11))
        assert [e.sequence for e in await store.read_events(tid, after=3, limit=2)] == [4, 5]
        assert [e.sequence for e in await store.read_events(tid, limit=1)] == [1]
        assert await store.read_events(tid, after=10) == []
        assert await store.read_events(tid, after=99) == []
        texts = [text_of(e) for e in await store.read_events(tid)]
        assert texts == [f"m{i}" for i in range(1, 11)]

    async def test_event_page_pages_backwards(self, thread_store: ThreadStore) -> None:
        """``event_page`` gives the newest events first and pages back with ``next_before``."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        empty = await store.event_page(tid)
        assert empty.events == () and empty.next_before is None
        await store.append_events(tid, [user_item(f"m{i}") for i in range(1, 8)])
        page = await store.event_page(tid, limit=3)
        assert [e.sequence for e in page.events] == [5, 6, 7]
        assert page.next_before == 5
        page = await store.event_page(tid, before=page.next_before, limit=3)
        assert [e.sequence for e in page.events] == [2, 3, 4]
        assert page.next_before == 2
        page = await store.event_page(tid, before=page.next_before, limit=3)
        assert [e.sequence for e in page.events] == [1]
        assert page.next_before is None
        whole = await store.event_page(tid, limit=50)
        assert [e.sequence for e in whole.events] == list(range(1, 8))
        assert whole.next_before is None
        with pytest.raises(ValueError):
            await store.event_page(tid, limit=0)
        with pytest.raises(ThreadNotFoundError):
            await store.event_page(new_thread_id("missing"))

    async def test_replay_starts_at_last_boundary(self, thread_store: ThreadStore) -> None:
        """``replay_events`` returns the events from the last compaction boundary on."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        await store.append_events(tid, [user_item("a"), user_item("b")])
        assert [e.sequence for e in await store.replay_events(tid)] == [1, 2]
        await store.append_events(tid, [ItemCompleted("turn-1", ContextCompaction("sum"))])
        await store.append_events(tid, [user_item("c")])
        assert [e.sequence for e in await store.replay_events(tid)] == [3, 4]
        # A boundary in the middle of a batch.
        await store.append_events(tid, [user_item("d"), native_boundary(), user_item("e")])
        replay = await store.replay_events(tid)
        assert [e.sequence for e in replay] == [6, 7]
        first = replay[0].event
        assert isinstance(first, ItemCompleted) and is_compaction_boundary(first.item)
        # A provider_metadata item that is not a boundary does not move the start.
        await store.append_events(
            tid, [ItemCompleted("turn-2", ProviderMetadata({"output": [{"type": "message"}]}))]
        )
        assert [e.sequence for e in await store.replay_events(tid)] == [6, 7, 8]

    async def test_read_snapshot_folds_the_journal(self, thread_store: ThreadStore) -> None:
        """``read_snapshot`` is the metadata plus the items of ``read_events`` by turn."""
        store = thread_store
        tid = (await store.create_thread(make_metadata(title="snap"))).thread_id
        empty = await store.read_snapshot(tid)
        assert empty == ThreadSnapshot(await store.get_thread(tid), ())
        future = ItemCompleted("t2", UserMessage("f"), unknown_fields={"future": 1})
        later = ItemCompleted("t2", UserMessage("u", unknown_fields={"later": [1]}))
        batches: list[list[Event]] = [
            [user_item("a", "t1"), user_item("b", "t1")],
            [usage_event(3, 4, "t1"), user_item("c", "t1")],  # a turn across lines
            [user_item("d", "t2"), future, ItemCompleted("t2", AssistantMessage("e"))],
            [later],
            [native_boundary("t3")],
            [user_item("g", "t1")],  # a turn id that comes back is a new turn
        ]
        for batch in batches:
            await store.append_events(tid, batch)
        snapshot = await store.read_snapshot(tid)
        events = await store.read_events(tid)
        assert snapshot.metadata == await store.get_thread(tid)
        assert snapshot.turns == turns_from_events(events)
        assert [(t.turn_id, len(t.items)) for t in snapshot.turns] == [
            ("t1", 3),
            ("t2", 4),
            ("t3", 1),
            ("t1", 1),
        ]
        assert to_dict(snapshot.turns[1].items[1]) == to_dict(future.item)
        assert to_dict(snapshot.turns[1].items[3]) == to_dict(later.item)
        assert len(snapshot.items) == snapshot.metadata.item_count == 9
        with pytest.raises(ThreadNotFoundError):
            await store.read_snapshot(new_thread_id("missing"))

    # --- content --------------------------------------------------------------------------

    async def test_unicode_and_large_events(self, thread_store: ThreadStore) -> None:
        """Unicode, control characters and a 1 MiB event are kept exactly."""
        store = thread_store
        tid = (await store.create_thread(make_metadata(title="ünïcødé 標題 🧵"))).thread_id
        texts = [
            "héllo wörld — ñ",
            "日本語のテキスト",
            "emoji 🧵🚀👩‍💻",
            "right-to-left: שלום עולם",
            'nul \x00 tab \t newline \n quote " backslash \\',
            "\u2028\u2029 separators",
        ]
        large = ("0123456789abcdef" * (self.large_event_bytes // 16 + 1))[: self.large_event_bytes]
        events: list[Event] = [user_item(text) for text in texts]
        events.append(ItemCompleted("turn-1", AssistantMessage(large)))
        stored = await store.append_events(tid, events)
        read = await store.read_events(tid)
        assert event_bytes(read) == event_bytes(stored)
        assert text_of(read[-1]) == large
        assert [text_of(e) for e in read[:-1]] == texts
        assert (await store.get_thread(tid)).title == "ünïcødé 標題 🧵"
        # Fields a newer version wrote survive too.
        future = ItemCompleted("turn-1", UserMessage("x"), unknown_fields={"future": {"a": 1}})
        [entry] = await store.append_events(tid, [future])
        [back] = await store.read_events(tid, after=entry.sequence - 1)
        assert to_dict(back.event) == to_dict(future)

    # --- import ---------------------------------------------------------------------------

    async def test_import_events_verbatim(self, thread_store: ThreadStore) -> None:
        """``import_events`` keeps sequences and times, and refuses a gap or an overlap."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        old = 1_600_000_000_000
        entries = [
            JournalEvent(1, old, user_item("a")),
            JournalEvent(2, old + 5, usage_event(3, 4)),
            JournalEvent(3, old + 5, native_boundary()),
            JournalEvent(4, old + 9, ItemCompleted("t", UserMessage("x"), unknown_fields={"f": 1})),
        ]
        await store.import_events(tid, entries[:2])
        await store.import_events(tid, entries[2:])
        read = await store.read_events(tid)
        assert event_bytes(read) == event_bytes(entries)
        assert [e.sequence for e in await store.replay_events(tid)] == [3, 4]
        meta = await store.get_thread(tid)
        assert meta.usage == TokenUsage(3, 4, 7)
        assert meta.last_sequence == 4 and meta.item_count == 3

        with pytest.raises(SequenceConflictError) as info:
            await store.import_events(tid, [JournalEvent(4, old, user_item("dup"))])
        assert info.value.expected == 5
        with pytest.raises(SequenceConflictError):
            await store.import_events(tid, [JournalEvent(7, old, user_item("gap"))])
        with pytest.raises(SequenceConflictError):
            await store.import_events(
                tid, [JournalEvent(5, old, user_item("a")), JournalEvent(7, old, user_item("b"))]
            )
        with pytest.raises(UnserializableEventError):
            await store.import_events(tid, [JournalEvent(5, old, unserializable_event())])
        assert event_bytes(await store.read_events(tid)) == event_bytes(entries)
        got = await store.append_events(tid, [user_item("after import")])
        assert [e.sequence for e in got] == [5]
