"""``read_snapshot`` on the relational store kit: one query whose rows decode straight to
items (``storekit.turns_from_rows``) answers what folding the journal's events answers, for
every kind of row, and a row that does not decode is damage naming its sequence."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from roder_api.errors import StoreCorruptedError
from roder_api.events import Event, ItemCompleted, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.testing.conformance import make_metadata
from roder_api.threads import turns_from_events
from roder_api.transcript import ProviderMetadata, ToolResultRecord, UserMessage
from roder_sqlite_thread_store import SqliteThreadStore, SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio

THREAD = "snap-1"


def _batches() -> list[list[Event]]:
    return [
        [ItemCompleted("turn-1", UserMessage("hello"))],
        [UsageUpdated("turn-1", TokenUsage(1, 2, 3))],
        # Needs the codec's exact path (an integer beyond 64 bits): the row starts with its mark.
        [ItemCompleted("turn-1", ProviderMetadata({"big": 2**70}))],
        [
            ItemCompleted(
                "turn-2", ToolResultRecord("call-1", "tool", "out", display_payload=[1, "x"])
            )
        ],
        [ItemCompleted("turn-2", UserMessage("a")), ItemCompleted("turn-1", UserMessage("b"))],
    ]


async def _seed(path: Path) -> None:
    store = await SqliteThreadStoreFactory(path).open()
    try:
        await store.create_thread(make_metadata(THREAD))
        for batch in _batches():
            await store.append_events(THREAD, batch)
    finally:
        await store.aclose()


def _edit_row(path: Path, sequence: int, edit: object) -> None:
    with closing(sqlite3.connect(path)) as conn, conn:
        (raw,) = conn.execute(
            "SELECT event FROM roder_events WHERE thread_id = ? AND sequence = ?",
            (THREAD, sequence),
        ).fetchone()
        data = orjson.loads(raw)
        new = edit(data) if callable(edit) else edit
        conn.execute(
            "UPDATE roder_events SET event = ? WHERE thread_id = ? AND sequence = ?",
            (new if isinstance(new, bytes) else orjson.dumps(new), THREAD, sequence),
        )


async def test_snapshot_matches_the_fold_of_the_events_for_every_kind_of_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "threads.sqlite3"
    await _seed(path)

    def unknown_field(data: dict[str, object]) -> dict[str, object]:
        return {**data, "added_later": 1}  # an event field this code does not know

    _edit_row(path, 1, unknown_field)
    store = await SqliteThreadStoreFactory(path).open()
    try:
        events = await store.read_events(THREAD)
        snapshot = await store.read_snapshot(THREAD)
        assert snapshot.turns == turns_from_events(events)
        assert [t.turn_id for t in snapshot.turns] == ["turn-1", "turn-2", "turn-1"]
        assert snapshot.items[1] == ProviderMetadata({"big": 2**70})
        assert snapshot.metadata == await store.get_thread(THREAD)
        assert snapshot.metadata.item_count == len(snapshot.items) == 5
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    "damage",
    [
        {"type": "item_completed", "turn_id": "turn-1", "item": {"type": "user_message"}},
        {"type": "item_completed", "turn_id": "turn-1", "item": {"type": "no_such_item"}},
        {"type": "item_completed", "turn_id": "turn-1", "item": "not a record"},
        {"type": "item_completed", "item": {"type": "user_message", "text": "x"}, "x": 1},
        b"[1, 2",
    ],
)
async def test_a_row_that_does_not_decode_fails_the_snapshot_naming_its_sequence(
    tmp_path: Path, damage: object
) -> None:
    path = tmp_path / "threads.sqlite3"
    await _seed(path)
    _edit_row(path, 4, damage)
    store = await SqliteThreadStoreFactory(path).open()
    try:
        with pytest.raises(StoreCorruptedError, match="sequence 4") as caught:
            await store.read_snapshot(THREAD)
        assert caught.value.thread_id == THREAD
    finally:
        await store.aclose()


# --- windows of joined rows (``joined_events_sql``) -------------------------------------------

BIG = 2**70 + 1  # read back as a float (not equal to it) by anything but the exact decoder


@pytest.mark.parametrize("window", [1, 2, 3, 512])
async def test_the_snapshot_is_the_fold_of_the_events_whatever_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    monkeypatch.setattr(SqliteThreadStore, "joined_window", window)
    path = tmp_path / "threads.sqlite3"
    store = await SqliteThreadStoreFactory(path).open()
    try:
        await store.create_thread(make_metadata(THREAD))
        for i in range(7):
            await store.append_events(
                THREAD, [ItemCompleted(f"turn-{i // 3}", UserMessage(f"{i}"))]
            )
        # A row for the exact decoder in a later window: never parsed as part of a window.
        await store.append_events(THREAD, [ItemCompleted("turn-9", ProviderMetadata({"big": BIG}))])
        await store.append_events(THREAD, [UsageUpdated("turn-9", TokenUsage(1, 2, 3))])
        snapshot = await store.read_snapshot(THREAD)
        assert snapshot.turns == turns_from_events(await store.read_events(THREAD))
        assert snapshot.items[-1] == ProviderMetadata({"big": BIG})
        assert len(snapshot.items) == 8
    finally:
        await store.aclose()


async def test_rows_that_are_json_only_together_are_damage(tmp_path: Path) -> None:
    """Two damaged rows that parse as two events once joined (the first runs into the
    second, which holds two; both start with ``{``) keep the count of values: the ``null``
    between every two rows sees it, and the rows are read one by one."""
    path = tmp_path / "threads.sqlite3"
    await _seed(path)
    user = b'{"type":"item_completed","turn_id":"turn-1","item":{"type":"user_message","text":"%s"}'
    _edit_row(path, 2, user % b"a" + b',"x":[1')
    _edit_row(path, 3, b'{"z":2}]},' + user % b"b" + b"}," + user % b"c" + b"}")
    store = await SqliteThreadStoreFactory(path).open()
    try:
        with pytest.raises(StoreCorruptedError, match="sequence 2"):
            await store.read_snapshot(THREAD)
    finally:
        await store.aclose()
