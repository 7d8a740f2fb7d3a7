"""The value rule of the thread-store conformance kit (a mixin of ``ThreadStoreConformance``).

Whatever the standard library's ``json`` round-trips in an event round-trips through every
store: lone surrogates in text, integers beyond 64 bits, nesting up to
``roder_api.codec.MAX_NESTING`` levels. Beyond that (or for values JSON cannot carry) a
store raises ``UnserializableEventError`` naming the path to the value, before it writes
anything. The checks here read back through a second store object too, so a store that
only remembers the objects it was given (and never decodes what it wrote) does not pass by
accident.
"""

from __future__ import annotations

from typing import Any

import pytest

from roder_api.codec import MAX_NESTING, to_dict
from roder_api.errors import UnserializableEventError
from roder_api.events import Event, ItemCompleted, JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata, ThreadStore, ThreadStoreFactory
from roder_api.transcript import ProviderMetadata, ToolResultRecord, UserMessage

LONE_SURROGATES = ("\ud800", "\udfff", "a\ud83dz", "cut mid-pair: \ud83d")
"""Texts holding lone surrogates (what JavaScript leaves when it cuts text mid-pair)."""

BIG_INTEGERS = (2**64, -(2**63) - 1, 10**40, -(2**200), 2**63 - 1)
"""Integers at and beyond 64 bits (the last one just fits)."""


def nested(depth: int, leaf: Any = "bottom") -> Any:
    """Return ``depth`` lists nested inside each other around ``leaf``."""
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


def _deepest_event(depth: int) -> ItemCompleted:
    """Return an event whose JSON nests exactly ``depth`` levels.

    The event object is level 1, its item level 2, the item's ``data`` level 3.
    """
    return ItemCompleted("turn-1", ProviderMetadata({"deep": nested(depth - 3)}))


def value_events() -> list[Event]:
    """Return events holding every value the rule says must survive."""
    surrogate_keys = {text: text for text in LONE_SURROGATES}
    return [
        *(ItemCompleted("turn-1", UserMessage(text)) for text in LONE_SURROGATES),
        ItemCompleted(
            "turn-1",
            ToolResultRecord("call-1", "tool", "result \ud800", display_payload=list(BIG_INTEGERS)),
        ),
        ItemCompleted(
            "turn-1",
            ProviderMetadata({"ints": {str(n): n for n in BIG_INTEGERS}, "keys": surrogate_keys}),
        ),
        UsageUpdated("turn-1", TokenUsage(2**64, 1, 2**64 + 1)),
        ItemCompleted("turn-1", UserMessage("x"), unknown_fields={"future": [2**70, "\udc00"]}),
        _deepest_event(MAX_NESTING),
        ItemCompleted("turn-1", UserMessage("plain, after the others")),
    ]


def _dicts(entries: list[JournalEvent]) -> list[Any]:
    return [(entry.sequence, to_dict(entry.event)) for entry in entries]


def _same(left: Any, right: Any) -> bool:
    """Return True when two JSON values are equal with their types (1 is not 1.0)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


class ThreadStoreValueConformance:
    """The value rule: stdlib-``json`` values round-trip; the rest is refused with its path.

    Uses the ``thread_store`` and ``thread_store_factory`` fixtures of
    ``ThreadStoreConformance``.
    """

    async def test_values_stdlib_json_carries_round_trip(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Lone surrogates, integers beyond 64 bits and deep nesting survive every read."""
        store = thread_store
        now = 1_700_000_000_000
        tid = (await store.create_thread(ThreadMetadata("values-1", now, now))).thread_id
        events = value_events()
        stored = await store.append_events(tid, events[:3])
        stored += await store.append_events(tid, events[3:])
        expected = [to_dict(event) for event in events]
        assert [to_dict(entry.event) for entry in stored] == expected
        other = await thread_store_factory.open()
        try:
            for reader in (store, other):
                read = await reader.read_events(tid)
                assert _same(_dicts(read), _dicts(stored)), "a value changed on its way back"
                tail = await reader.read_events(tid, after=len(events) - 2)
                assert _same(_dicts(tail), _dicts(stored[-2:]))
                page = await reader.event_page(tid, limit=3)
                assert _same(_dicts(list(page.events)), _dicts(stored[-3:]))
                replay = await reader.replay_events(tid)
                assert _same(_dicts(replay), _dicts(stored))
                meta = await reader.get_thread(tid)
                assert meta.usage.prompt_tokens == 2**64
                assert meta.usage.total_tokens == 2**64 + 1
                assert meta.last_sequence == len(events)
        finally:
            await other.aclose()

    async def test_values_import_events_round_trip(self, thread_store: ThreadStore) -> None:
        """``import_events`` (what ``roder migrate`` uses) keeps the same values exactly."""
        store = thread_store
        tid = (await store.create_thread(ThreadMetadata("values-2", 1, 1))).thread_id
        entries = [
            JournalEvent(index + 1, 1_000 + index, event)
            for index, event in enumerate(value_events())
        ]
        await store.import_events(tid, entries)
        read = await store.read_events(tid)
        assert _same(_dicts(read), _dicts(entries))
        assert [entry.recorded_at_ms for entry in read] == [e.recorded_at_ms for e in entries]

    async def test_values_thread_metadata_round_trips(
        self, thread_store: ThreadStore, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """A title and ``extra`` follow the same rule as events."""
        store = thread_store
        extra = {"big": 2**80, "text": "\udfff", "deep": nested(100)}
        meta = ThreadMetadata("values-3", 5, 5, title="half an emoji \ud83d", extra=extra)
        await store.create_thread(meta)
        other = await thread_store_factory.open()
        try:
            for reader in (store, other):
                got = await reader.get_thread("values-3")
                assert got.title == meta.title
                assert _same(dict(got.extra), extra)
                listed = [t for t in (await reader.list_threads()).threads]
                assert [t.title for t in listed] == [meta.title]
        finally:
            await other.aclose()
        updated = await store.update_thread("values-3", title="\udc00 new", extra={"n": -(2**70)})
        assert updated.title == "\udc00 new"
        again = await store.get_thread("values-3")
        assert again.title == "\udc00 new" and _same(dict(again.extra), {"n": -(2**70)})

    @pytest.mark.parametrize(
        ("value", "path"),
        [
            (nested(MAX_NESTING - 2), "item.data.deep" + "[0]" * (MAX_NESTING - 3)),
            ({"rows": [1, 2, {"x": object()}]}, "item.data.deep.rows[2].x"),
            ({"rows": [0.5, float("nan")]}, "item.data.deep.rows[1]"),
            ({"k": {1: "one"}}, "item.data.deep.k[1]"),
            ({"blob": b"raw"}, "item.data.deep.blob"),
        ],
        ids=["one level too deep", "object", "nan", "int key", "bytes"],
    )
    async def test_values_beyond_the_rule_are_refused_with_their_path(
        self, thread_store: ThreadStore, value: Any, path: str
    ) -> None:
        """Beyond the rule: ``UnserializableEventError`` naming the path; nothing written."""
        store = thread_store
        tid = (await store.create_thread(ThreadMetadata("values-4", 1, 1))).thread_id
        good = ItemCompleted("turn-1", UserMessage("kept"))
        bad = ItemCompleted("turn-1", ProviderMetadata({"deep": value}))
        with pytest.raises(UnserializableEventError) as caught:
            await store.append_events(tid, [good, bad])
        assert path in str(caught.value), f"the error does not name {path!r}: {caught.value}"
        assert await store.read_events(tid) == []
        assert (await store.get_thread(tid)).last_sequence == 0
        with pytest.raises(UnserializableEventError):
            await store.import_events(tid, [JournalEvent(1, 1, good), JournalEvent(2, 1, bad)])
        assert await store.read_events(tid) == []

    @pytest.mark.parametrize(
        ("value", "path"),
        # The metadata object is level 1, ``extra`` level 2, ``extra["deep"]`` level 3.
        [
            (nested(MAX_NESTING - 1), "extra.deep" + "[0]" * (MAX_NESTING - 2)),
            ({"x": object()}, "extra.deep.x"),
            ([float("inf")], "extra.deep[0]"),
        ],
        ids=["one level too deep", "object", "infinity"],
    )
    async def test_values_beyond_the_rule_in_metadata_are_refused(
        self, thread_store: ThreadStore, value: Any, path: str
    ) -> None:
        """A title or ``extra`` beyond the rule is refused the same way; nothing changes."""
        store = thread_store
        with pytest.raises(UnserializableEventError) as caught:
            await store.create_thread(ThreadMetadata("values-5", 1, 1, extra={"deep": value}))
        assert path in str(caught.value), f"the error does not name {path!r}: {caught.value}"
        assert not await store.thread_exists("values-5")
        await store.create_thread(ThreadMetadata("values-5", 1, 1, title="kept"))
        with pytest.raises(UnserializableEventError) as caught:
            await store.update_thread("values-5", title="new", extra={"deep": value})
        assert path in str(caught.value), f"the error does not name {path!r}: {caught.value}"
        meta = await store.get_thread("values-5")
        assert (meta.title, meta.extra) == ("kept", {})
