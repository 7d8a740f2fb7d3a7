"""Only torn tails are cut: an unterminated last line is skipped by reads and moved to the
quarantine file by the next write; a complete line that fails its check is damage."""

from __future__ import annotations

import orjson
import pytest
from jsonl_helpers import journal_with, msg

from roder_api.codec import dumps_list
from roder_api.errors import StoreCorruptedError, StoreError
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._format import encode_record

pytestmark = [pytest.mark.anyio, pytest.mark.core]


def flip_last_line(data: bytes) -> bytes:
    """Flip one bit inside the record of the last complete line."""
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    position = start + data[start:].index(b"message") + 2
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


async def test_a_flipped_bit_in_the_last_complete_line_is_damage_never_cut(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "t", 3)
    damaged = flip_last_line(path.read_bytes())
    path.write_bytes(damaged)
    for index in factory.base_path.glob("index.sqlite3*"):
        index.unlink()  # nothing vouches for the journal: the store must scan it all
    store = await factory.open()
    with pytest.raises(StoreCorruptedError) as caught:
        await store.read_events("t")
    assert "line 4" in str(caught.value) and "roder fsck --repair" in str(caught.value)
    with pytest.raises(StoreCorruptedError):
        await store.replay_events("t")
    with pytest.raises(StoreCorruptedError):
        await store.append_events("t", [msg(9)])  # never written after damage it saw
    check = await store.check_thread("t")
    assert check.damage is not None and check.damage.line == 4 and not check.ok
    assert path.read_bytes() == damaged  # the acknowledged record is still there
    await store.aclose()

    store = await factory.open()  # a fresh store (a new process) judges it the same way
    with pytest.raises(StoreCorruptedError):
        await store.read_events("t")
    assert path.read_bytes() == damaged
    repair = await store.repair_thread("t")
    assert repair.quarantine is not None
    assert path.read_bytes() + repair.quarantine.read_bytes() == damaged
    assert [e.sequence for e in await store.read_events("t")] == [1, 2]
    assert (await store.check_thread("t")).ok
    await store.aclose()


@pytest.mark.parametrize("torn", ["partial", "valid-without-newline"])
async def test_a_torn_tail_is_skipped_by_reads_and_quarantined_by_the_next_write(
    factory: JsonlThreadStoreFactory, torn: str
) -> None:
    path = await journal_with(factory, "t", 3)
    intact = path.read_bytes()
    events = orjson.loads(dumps_list([msg(4)]))
    line = encode_record({"v": 1, "k": "events", "seq": 4, "t": 5, "events": events})
    tail = line[:37] if torn == "partial" else line[:-1]
    path.write_bytes(intact + tail)
    store = await factory.open()
    assert [e.sequence for e in await store.read_events("t")] == [1, 2, 3]
    assert [e.sequence for e in await store.replay_events("t")] == [1, 2, 3]
    assert (await store.get_thread("t")).last_sequence == 3
    assert [m.thread_id for m in (await store.list_threads()).threads] == ["t"]
    page = await store.event_page("t", limit=2)
    assert [e.sequence for e in page.events] == [2, 3]
    assert path.read_bytes() == intact + tail  # reads never write
    assert not list(path.parent.glob("t.jsonl.quarantine-*"))

    appended = await store.append_events("t", [msg(9)])
    assert [e.sequence for e in appended] == [4]
    quarantines = list(path.parent.glob("t.jsonl.quarantine-*"))
    assert len(quarantines) == 1 and quarantines[0].read_bytes() == tail  # moved, not lost
    assert path.read_bytes().startswith(intact) and path.read_bytes().endswith(b"\n")
    assert [e.sequence for e in await store.read_events("t")] == [1, 2, 3, 4]
    assert (await store.check_thread("t")).ok
    await store.aclose()


async def test_fsck_repair_moves_a_torn_tail_to_the_quarantine_file(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "t", 2)
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"c":"0')
    store = await factory.open()
    check = await store.check_thread("t")
    assert check.damage is not None and check.damage.kind == "torn_tail"
    assert path.read_bytes() == intact + b'{"c":"0'
    repair = await store.repair_thread("t")
    assert repair.quarantine is not None and repair.quarantine.read_bytes() == b'{"c":"0'
    assert path.read_bytes() == intact and (await store.check_thread("t")).ok
    await store.aclose()


async def test_read_only_and_must_exist_opens_create_nothing(
    factory: JsonlThreadStoreFactory,
) -> None:
    missing = factory.base_path.parent / "missing"
    for options in ({"read_only": True}, {"must_exist": True}):
        with pytest.raises(StoreError, match="does not exist; nothing was created"):
            await JsonlThreadStoreFactory(missing, **options).open()  # type: ignore[arg-type]
        assert not missing.exists()
    path = await journal_with(factory, "t", 2)
    path.write_bytes(path.read_bytes() + b'{"c":"torn')
    before = {
        p: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in factory.base_path.rglob("*")
        if p.is_file()
    }
    reader = await JsonlThreadStoreFactory(factory.base_path, read_only=True).open()
    assert [e.sequence for e in await reader.read_events("t")] == [1, 2]
    assert [m.thread_id for m in (await reader.list_threads()).threads] == ["t"]
    assert not (await reader.check_thread("t")).ok  # the torn tail is reported
    with pytest.raises(StoreError, match="opened read-only"):
        await reader.append_events("t", [msg(3)])
    with pytest.raises(StoreError, match="opened read-only"):
        await reader.repair_thread("t")
    with pytest.raises(StoreError, match="opened read-only"):
        async with reader.lease("t", owner="me"):
            pass
    await reader.aclose()
    after = {
        p: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in factory.base_path.rglob("*")
        if p.is_file()
    }
    assert after == before
