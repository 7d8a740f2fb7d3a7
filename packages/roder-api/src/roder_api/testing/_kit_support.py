"""Shared pieces of the conformance kits: sample events and metadata, journal checks."""

from __future__ import annotations

import importlib.util
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from roder_api.codec import dumps, to_dict
from roder_api.events import (
    ItemCompleted,
    JournalEvent,
    UsageUpdated,
)
from roder_api.inference import (
    TokenUsage,
)
from roder_api.threads import (
    ThreadMetadata,
    ThreadStore,
)
from roder_api.transcript import (
    AssistantMessage,
    ProviderMetadata,
    UserMessage,
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


def backends() -> list[str]:
    backends = ["asyncio"]
    if importlib.util.find_spec("trio") is not None:
        backends.append("trio")
    return backends


def now_ms() -> int:
    return int(time.time() * 1000)


def new_thread_id(prefix: str = "t") -> str:
    """Return a fresh, valid thread id."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def make_metadata(thread_id: str | None = None, **fields: Any) -> ThreadMetadata:
    """Return metadata for a new thread (now, unless ``created_at_ms``/``updated_at_ms``)."""
    now = now_ms()
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
    return [dumps(entry) for entry in entries]


async def all_threads(store: ThreadStore, limit: int) -> list[ThreadMetadata]:
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


def calls_with_id(
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
        lambda: store.read_snapshot(thread_id),
        lambda: store.update_thread(thread_id, title="x"),
        lambda: store.delete_thread(thread_id),
    ]


def text_of(entry: JournalEvent) -> str:
    """Return the text of the message an ``ItemCompleted`` journal event carries."""
    event = entry.event
    assert isinstance(event, ItemCompleted), f"expected an item, got {event!r}"
    item = event.item
    assert isinstance(item, (UserMessage, AssistantMessage)), f"expected a message: {item!r}"
    return item.text


def check_batches(
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


__all__ = [
    "BAD_THREAD_IDS",
    "all_threads",
    "backends",
    "calls_with_id",
    "check_batches",
    "event_bytes",
    "make_metadata",
    "native_boundary",
    "new_thread_id",
    "now_ms",
    "text_of",
    "unserializable_event",
    "usage_event",
    "user_item",
]
