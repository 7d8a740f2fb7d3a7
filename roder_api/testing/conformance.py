"""The conformance kits: pytest base classes that a store or engine plugin runs against itself.

A thread-store plugin subclasses :class:`ThreadStoreConformance` and gives it a factory::

    import pytest
    from roder_api.testing.conformance import ThreadStoreConformance
    from roder_mystore import MyStoreFactory

    class TestMyStore(ThreadStoreConformance):
        @pytest.fixture
        def thread_store_factory(self, tmp_path):
            return MyStoreFactory(tmp_path / "db")   # an empty store for each test

An engine plugin subclasses :class:`InferenceEngineConformance` the same way, overriding the
``inference_engine`` fixture. Every check runs under asyncio and under trio (when trio is
installed). Each check is an ordinary ``async`` method, so a test may also call one directly
(``await ThreadStoreConformance().test_batch_append_is_atomic(store)``): it raises
``AssertionError`` when the store breaks the rule.

This module needs pytest; importing :mod:`roder_api.testing` does not.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar

import anyio
import orjson
import pytest

from roder_api.codec import to_dict
from roder_api.errors import (
    InvalidThreadIdError,
    SequenceConflictError,
    StoppedError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
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
    INFERENCE_EVENT_TYPES,
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    MessageDelta,
    ModelDescriptor,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.threads import (
    ThreadMetadata,
    ThreadStore,
    ThreadStoreFactory,
    fold_metadata,
    listing_key,
    turns_from_events,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    UserMessage,
    is_compaction_boundary,
)

BAD_THREAD_IDS: tuple[str, ...] = (
    "../x",
    "/etc/passwd",
    "",
    "a\x00b",
    "a\nb",
    "x" * 129,
    ".hidden",
    "a/b",
    "a b",
)
"""Thread ids every store must refuse with ``InvalidThreadIdError``."""


def _backends() -> list[str]:
    backends = ["asyncio"]
    if importlib.util.find_spec("trio") is not None:
        backends.append("trio")
    return backends


def _now_ms() -> int:
    return int(time.time() * 1000)


def new_thread_id(prefix: str = "t") -> str:
    """Return a fresh, valid thread id."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def make_metadata(thread_id: str | None = None, **fields: Any) -> ThreadMetadata:
    """Return metadata for a new thread (now, unless ``created_at_ms``/``updated_at_ms``)."""
    now = _now_ms()
    fields.setdefault("created_at_ms", now)
    fields.setdefault("updated_at_ms", fields["created_at_ms"])
    return ThreadMetadata(new_thread_id() if thread_id is None else thread_id, **fields)


def user_item(text: str, turn_id: str = "turn-1") -> ItemCompleted:
    """Return an ``ItemCompleted`` event of a user message."""
    return ItemCompleted(turn_id, UserMessage(text))


def usage_event(prompt: int, completion: int, turn_id: str = "turn-1") -> UsageUpdated:
    """Return a ``UsageUpdated`` event of ``prompt`` + ``completion`` tokens."""
    return UsageUpdated(turn_id, TokenUsage(prompt, completion, prompt + completion))


def native_boundary(turn_id: str = "turn-1") -> ItemCompleted:
    """Return an ``ItemCompleted`` event of a native compaction boundary."""
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "ZW5j"}
    kept = {"type": "message", "role": "user", "content": "kept"}
    return ItemCompleted(
        turn_id, ProviderMetadata({"output": [compaction], "compacted_input": [kept, compaction]})
    )


def unserializable_event(turn_id: str = "turn-1") -> ItemCompleted:
    """Return an event that JSON cannot carry (it holds a Python ``object()``)."""
    return ItemCompleted(turn_id, ProviderMetadata({"opaque": object()}))


def event_bytes(entries: Sequence[JournalEvent]) -> list[bytes]:
    """Return the canonical JSON bytes of journal events (to compare journals exactly)."""
    return [orjson.dumps(to_dict(entry)) for entry in entries]


async def _all_threads(store: ThreadStore, limit: int) -> list[ThreadMetadata]:
    out: list[ThreadMetadata] = []
    cursor: str | None = None
    while True:
        page = await store.list_threads(cursor=cursor, limit=limit)
        assert len(page.threads) <= limit, "a listing page holds more than `limit` threads"
        out.extend(page.threads)
        if page.next_cursor is None:
            return out
        assert page.threads, "a listing page with a next cursor holds no threads"
        cursor = page.next_cursor


class ThreadStoreConformance:
    """The thread-store conformance kit: subclass it and override ``thread_store_factory``.

    The factory fixture must return a :class:`ThreadStoreFactory` whose stores start empty
    for each test and whose ``open()`` may be called several times (a reopen, or two store
    objects on the same data at once). Class attributes tune the load of the concurrency
    checks.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    concurrent_tasks: ClassVar[int] = 16
    """How many tasks append at once in the concurrency checks."""

    batches_per_task: ClassVar[int] = 8
    """How many batches each of those tasks appends."""

    large_event_bytes: ClassVar[int] = 1 << 20
    """The size of the large event the store must keep exactly (1 MiB)."""

    @pytest.fixture(params=_backends())
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Run every check under asyncio and trio."""
        return str(request.param)

    @pytest.fixture
    def thread_store_factory(self) -> ThreadStoreFactory:
        """Return the factory of the store under test (override this fixture)."""
        raise NotImplementedError(
            "override the `thread_store_factory` fixture to return your store's factory"
        )

    @pytest.fixture
    async def thread_store(self, thread_store_factory: ThreadStoreFactory) -> AsyncIterator[Any]:
        """Return an open store from the factory, closed after the test."""
        store = await thread_store_factory.open()
        try:
            yield store
        finally:
            await store.aclose()

    # --- create, exists, not found --------------------------------------------------------

    async def test_create_get_and_exists(self, thread_store: ThreadStore) -> None:
        """A created thread can be read back; a missing one is reported as missing."""
        store = thread_store
        created_at = _now_ms() - 5000
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

    async def test_append_assigns_consecutive_sequences(self, thread_store: ThreadStore) -> None:
        """Batches get consecutive sequence numbers from 1 and read back as returned."""
        store = thread_store
        tid = (await store.create_thread(make_metadata())).thread_id
        before = _now_ms()
        returned: list[JournalEvent] = []
        for size in (1, 3, 2):
            batch = [user_item(f"m{len(returned) + i}") for i in range(size)]
            got = await store.append_events(tid, batch)
            assert [e.event for e in got] == batch
            returned.extend(got)
        assert [e.sequence for e in returned] == [1, 2, 3, 4, 5, 6]
        assert all(before - 1000 <= e.recorded_at_ms <= _now_ms() + 1000 for e in returned)
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
        texts = [_text(e) for e in await store.read_events(tid)]
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

    # --- metadata -------------------------------------------------------------------------

    async def test_metadata_usage_totals_and_counts(self, thread_store: ThreadStore) -> None:
        """Usage totals, item counts and times are folded from the journal and kept."""
        store = thread_store
        created = _now_ms() - 60_000
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
        base = _now_ms() - 1_000_000
        # Some share an update time, to check that ties page correctly too.
        times = [base + 10, base + 20, base + 20, base + 20, base + 30, base + 5, base + 40]
        for index, stamp in enumerate(times):
            await store.create_thread(make_metadata(f"list-{index}", created_at_ms=stamp))
        everything = await _all_threads(store, limit=100)
        assert [m.thread_id for m in everything] == [
            m.thread_id for m in sorted(everything, key=listing_key, reverse=True)
        ]
        assert len(everything) == len(times)
        for limit in (1, 2, 3):
            paged = await _all_threads(store, limit)
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
        base = _now_ms() - 1_000_000
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
        assert tid not in [m.thread_id for m in await _all_threads(store, 50)]
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
            for call in _calls_with_id(store, bad, entry):
                with pytest.raises(InvalidThreadIdError):
                    await call()
        assert (await store.list_threads()).threads == ()
        longest = "a" * 128
        await store.create_thread(make_metadata(longest))
        await store.append_events(longest, [user_item("ok")])
        assert (await store.get_thread(longest)).last_sequence == 1

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
        assert _text(read[-1]) == large
        assert [_text(e) for e in read[:-1]] == texts
        assert (await store.get_thread(tid)).title == "ünïcødé 標題 🧵"
        # Fields a newer version wrote survive too.
        future = ItemCompleted("turn-1", UserMessage("x"), unknown_fields={"future": {"a": 1}})
        [entry] = await store.append_events(tid, [future])
        [back] = await store.read_events(tid, after=entry.sequence - 1)
        assert to_dict(back.event) == to_dict(future)

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
        _check_batches(await store.read_events(tid), returned)
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
            _check_batches(await store.read_events(tid), returned[tid])

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
            _check_batches(journal[2:], returned, first_sequence=3)
            assert event_bytes(await second.read_events(tid)) == event_bytes(journal)
            assert await first.get_thread(tid) == await second.get_thread(tid)
        finally:
            await first.aclose()
            await second.aclose()


def _calls_with_id(
    store: ThreadStore, thread_id: str, entry: JournalEvent
) -> list[Callable[[], Awaitable[object]]]:
    """Return a call of every thread-id-taking store method for ``thread_id``."""
    return [
        lambda: store.get_thread(thread_id),
        lambda: store.append_events(thread_id, [user_item("x")]),
        lambda: store.import_events(thread_id, [entry]),
        lambda: store.read_events(thread_id),
        lambda: store.event_page(thread_id),
        lambda: store.replay_events(thread_id),
        lambda: store.update_thread(thread_id, title="x"),
        lambda: store.delete_thread(thread_id),
    ]


def _text(entry: JournalEvent) -> str:
    """Return the text of the message an ``ItemCompleted`` journal event carries."""
    event = entry.event
    assert isinstance(event, ItemCompleted), f"expected an item, got {event!r}"
    item = event.item
    assert isinstance(item, (UserMessage, AssistantMessage)), f"expected a message: {item!r}"
    return item.text


def _check_batches(
    journal: Sequence[JournalEvent],
    returned: Sequence[Sequence[JournalEvent]],
    *,
    first_sequence: int = 1,
) -> None:
    """Assert the journal holds every returned batch once, each contiguous and in order."""
    total = sum(len(batch) for batch in returned)
    sequences = [e.sequence for e in journal]
    assert sequences == list(range(first_sequence, first_sequence + total)), (
        "sequence numbers are not consecutive (a batch was lost, duplicated or gapped)"
    )
    by_sequence = {e.sequence: e for e in journal}
    for batch in returned:
        assert [e.sequence for e in batch] == list(
            range(batch[0].sequence, batch[0].sequence + len(batch))
        ), "a batch was not given consecutive sequence numbers"
        for entry in batch:
            stored = by_sequence[entry.sequence]
            assert to_dict(stored.event) == to_dict(entry.event), (
                "the journal disagrees with what append_events returned (interleaved batches)"
            )


class InferenceEngineConformance:
    """The engine conformance kit: subclass it and override ``inference_engine``.

    The checks call the engine the way the runtime does and check the shape of what it
    yields. Override :meth:`make_request` when the engine needs a particular model or
    transcript to answer (for example against a loopback test server).
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    model: ClassVar[str] = ""
    """The model id to request; empty: the first model ``list_models`` offers, else
    ``default``."""

    @pytest.fixture(params=_backends())
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Run every check under asyncio and trio."""
        return str(request.param)

    @pytest.fixture
    def inference_engine(self) -> InferenceEngine:
        """Return the engine under test (override this fixture)."""
        raise NotImplementedError("override the `inference_engine` fixture to return your engine")

    async def make_request(
        self, engine: InferenceEngine, text: str = "Hello, engine!"
    ) -> AgentInferenceRequest:
        """Return the request the checks send (a single user message)."""
        model = self.model
        if not model:
            models = await engine.list_models(InferenceProviderContext())
            model = models[0].id if models else "default"
        return AgentInferenceRequest(model, None, [UserMessage(text)])

    @staticmethod
    def context(purpose: str = "turn") -> InferenceTurnContext:
        """Return the context the checks pass."""
        return InferenceTurnContext("conformance", "turn-1", "step-1", purpose, 1)

    async def _collect(self, stream: AsyncIterator[InferenceEvent]) -> list[InferenceEvent]:
        events: list[InferenceEvent] = []
        try:
            async for event in stream:
                events.append(event)
        finally:
            await _aclose(stream)
        return events

    async def test_identity(self, inference_engine: InferenceEngine) -> None:
        """The engine has an id, capabilities, and lists its models."""
        engine = inference_engine
        assert isinstance(engine, InferenceEngine)
        assert isinstance(engine.id, str) and engine.id, "set the engine's `id`"
        assert isinstance(engine.capabilities, InferenceCapabilities)
        models = await engine.list_models(InferenceProviderContext())
        for model in models:
            assert isinstance(model, ModelDescriptor) and model.id
        if engine.requires_native_compaction:
            assert engine.supports_native_compaction, (
                "requires_native_compaction is set but compact_turn is not overridden"
            )

    async def test_stream_turn_shape(self, inference_engine: InferenceEngine) -> None:
        """``stream_turn`` yields engine events and ends with exactly one Completed/Failed."""
        engine = inference_engine
        request = await self.make_request(engine)
        events = await self._collect(engine.stream_turn(self.context(), request))
        _check_stream(events, engine)
        assert isinstance(events[-1], Completed), f"the turn did not complete: {events[-1]!r}"

    async def test_stream_turn_can_be_closed_early(self, inference_engine: InferenceEngine) -> None:
        """Closing the stream after its first event is clean, and the engine still works."""
        engine = inference_engine
        request = await self.make_request(engine)
        stream = engine.stream_turn(self.context(), request)
        first = await stream.__anext__()
        assert isinstance(first, INFERENCE_EVENT_TYPES)
        await _aclose(stream)
        events = await self._collect(engine.stream_turn(self.context(), request))
        _check_stream(events, engine)

    async def test_concurrent_streams(self, inference_engine: InferenceEngine) -> None:
        """Several turns may stream from one engine at once."""
        engine = inference_engine
        results: list[list[InferenceEvent]] = []

        async def one(index: int) -> None:
            request = await self.make_request(engine, f"Hello number {index}")
            results.append(await self._collect(engine.stream_turn(self.context(), request)))

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(one, index)
        assert len(results) == 4
        for events in results:
            _check_stream(events, engine)

    async def test_compact_turn_shape(self, inference_engine: InferenceEngine) -> None:
        """A native compaction yields exactly one boundary, no tool call, then Completed."""
        engine = inference_engine
        if not engine.supports_native_compaction:
            pytest.skip(f"engine {engine.id!r} has no native compaction")
        request = await self.make_request(engine, "Please compact this conversation.")
        events = await self._collect(engine.compact_turn(self.context("compaction"), request))
        _check_stream(events, engine)
        assert isinstance(events[-1], Completed), f"the compaction failed: {events[-1]!r}"
        boundaries = [
            e for e in events if isinstance(e, ProviderMetadata) and is_compaction_boundary(e)
        ]
        assert len(boundaries) == 1, "a native compaction must yield exactly one boundary"
        assert not any(isinstance(e, ToolCallCompleted) for e in events)

    async def test_aclose(self, inference_engine: InferenceEngine) -> None:
        """``aclose`` (and ``async with``) release the engine without error."""
        async with inference_engine as engine:
            assert engine is inference_engine


async def _aclose(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _check_stream(events: Sequence[object], engine: InferenceEngine) -> None:
    """Assert the shape of one engine stream."""
    assert events, "the stream yielded nothing"
    for event in events:
        assert isinstance(event, INFERENCE_EVENT_TYPES), f"not an engine event: {event!r}"
    terminal = [e for e in events if isinstance(e, (Completed, Failed))]
    assert len(terminal) == 1, f"expected one Completed or Failed, got {terminal!r}"
    assert events[-1] is terminal[0], "Completed/Failed must be the last event"
    for event in events:
        if isinstance(event, (MessageDelta, ReasoningDelta)):
            assert isinstance(event.text, str)
        elif isinstance(event, ToolCallCompleted):
            assert engine.capabilities.tool_calls, "tool call from an engine without tool calls"
            assert event.id and event.name, "a tool call needs an id and a name"
            orjson.loads(event.arguments)
        elif isinstance(event, Usage):
            usage = event.usage
            assert isinstance(usage, TokenUsage)
            counts = to_dict(usage)
            assert all(v >= 0 for k, v in counts.items() if k != "type"), usage
            assert usage.prompt_tokens >= usage.cached_prompt_tokens, (
                "prompt_tokens must include the cached prompt tokens"
            )
            assert usage.prompt_tokens >= usage.cache_creation_prompt_tokens
        elif isinstance(event, ProviderMetadata):
            orjson.dumps(to_dict(event))
        elif isinstance(event, Failed):
            assert isinstance(event.message, str) and event.message


__all__ = [
    "BAD_THREAD_IDS",
    "InferenceEngineConformance",
    "ThreadStoreConformance",
    "event_bytes",
    "make_metadata",
    "native_boundary",
    "new_thread_id",
    "unserializable_event",
    "usage_event",
    "user_item",
]
