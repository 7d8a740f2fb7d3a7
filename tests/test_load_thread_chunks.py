"""``Runtime.load_thread`` is one ``ThreadStore.read_snapshot`` call, and every way a store
answers it folds the journal the same way: the contract's default (chunked reads, the memory
store), the store kit's one-worker-call default (SQLite) and the JSONL store's own pass
that decodes items straight from its lines."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api.errors import StoreCorruptedError, StoreError
from roder_api.events import Event, ItemCompleted, UsageUpdated
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.inference import TokenUsage
from roder_api.storekit import turns_from_events
from roder_api.testing import MemoryThreadStore, MemoryThreadStoreFactory, ScriptedEngine
from roder_api.threads import ThreadStore, ThreadStoreFactory
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio


def _runtime(factory: ThreadStoreFactory) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory)
    return Runtime(builder.build(), RuntimeConfig())


def _events() -> list[list[Event]]:
    """Batches with turns of 1 to 9 items, usage between them, and a turn id coming back."""
    batches: list[list[Event]] = []
    turn_ids = [f"turn-{n}" for n in range(12)] + ["turn-3", "turn-3b", "turn-3"]
    for n, turn_id in enumerate(turn_ids):
        items = [ItemCompleted(turn_id, UserMessage(f"{turn_id} {i}")) for i in range(n % 9 + 1)]
        # Some turns arrive in several batches (several lines, or one line of many events).
        batches.append(list(items[:2]))
        if items[2:]:
            batches.append(list(items[2:]))
        batches.append([UsageUpdated(turn_id, TokenUsage(1, 2, 3))])
    return batches


@pytest.mark.parametrize("store", ["jsonl", "memory", "sqlite"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
async def test_load_thread_in_chunks_folds_like_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, chunk: int
) -> None:
    factory: ThreadStoreFactory
    if store == "jsonl":
        factory = JsonlThreadStoreFactory(tmp_path / "store")
    elif store == "sqlite":
        factory = SqliteThreadStoreFactory(tmp_path / "threads.sqlite3")
    else:
        factory = MemoryThreadStoreFactory()
    monkeypatch.setattr(ThreadStore, "snapshot_chunk", chunk)
    async with _runtime(factory) as runtime:
        tid = (await runtime.create_thread()).thread_id
        for batch in _events():
            await runtime.append_events(tid, batch)
        events = await (await runtime.store()).read_events(tid)
        snapshot = await runtime.load_thread(tid)
        assert snapshot is not None
        assert snapshot.turns == turns_from_events(events)
        assert [t.turn_id for t in snapshot.turns][-3:] == ["turn-3", "turn-3b", "turn-3"]
        assert snapshot.metadata == await runtime.get_thread(tid)
        assert len(snapshot.items) == snapshot.metadata.item_count
        # A thread whose length is a multiple of the chunk ends with an empty read.
        empty = (await runtime.create_thread()).thread_id
        snap = await runtime.load_thread(empty)
        assert snap is not None and snap.turns == ()
        assert await runtime.load_thread("no-such-thread") is None


@pytest.mark.parametrize("line", [2, 50, 51, 52, 130, 201])
async def test_a_flipped_bit_fails_a_chunked_load_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: int
) -> None:
    """Every line's checksum is checked on a chunked load, also when the store knows the
    journal already (its index vouches for the size, so only the read loop can notice)."""
    monkeypatch.setattr(ThreadStore, "snapshot_chunk", 50)
    factory = JsonlThreadStoreFactory(tmp_path / "store")
    async with _runtime(factory) as runtime:
        tid = (await runtime.create_thread()).thread_id
        items = [UserMessage(f"{i} " + "lorem ipsum " * 30) for i in range(200)]
        for i, item in enumerate(items):
            await runtime.persist_turn_item(tid, f"turn-{i // 3}", item)
        snapshot = await runtime.load_thread(tid)  # the store now knows the journal
        assert snapshot is not None and snapshot.items == items
        path = (await runtime.store()).journal_path(tid)  # type: ignore[attr-defined]
        data = path.read_bytes()
        start = 0
        for _ in range(line - 1):
            start = data.index(b"\n", start) + 1
        position = data.index(b"lorem", start) + 2  # inside the record's text
        damaged = data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]
        path.write_bytes(damaged)
        with pytest.raises(StoreCorruptedError):
            await runtime.load_thread(tid)
        with pytest.raises(StoreCorruptedError):
            await runtime.load_thread(tid)  # judged the same way again
        assert path.read_bytes() == damaged


async def test_a_store_that_stops_answering_fails_load_thread_within_the_deadline() -> None:
    """``load_thread`` is bounded like every journal call: a stalled store is a StoreError
    naming the store and the call, within ``turn_timeout_s``, on every kind of store."""

    class Stalling(MemoryThreadStore):
        stall = False

        async def fault_point(self, operation: str, thread_id: str | None) -> None:
            if self.stall and operation == "read_events":
                await anyio.sleep_forever()

    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(MemoryThreadStoreFactory(store_class=Stalling))
    async with Runtime(builder.build(), RuntimeConfig(turn_timeout_s=0.3)) as runtime:
        tid = (await runtime.create_thread()).thread_id
        await runtime.persist_turn_item(tid, "turn-1", UserMessage("kept"))
        store = await runtime.store()
        assert isinstance(store, Stalling)
        store.stall = True
        with anyio.fail_after(10):
            with pytest.raises(StoreError, match=r"'memory' did not answer within 0\.3 s \(load"):
                await runtime.load_thread(tid)
        store.stall = False
        snapshot = await runtime.load_thread(tid)
        assert snapshot is not None and snapshot.items == [UserMessage("kept")]
