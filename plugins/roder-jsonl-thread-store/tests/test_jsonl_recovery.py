"""Recovery of the JSONL store: torn and unterminated tails, mid-file damage, newer formats."""

from __future__ import annotations

import logging

import pytest
from jsonl_helpers import journal_with, msg

from roder_api.codec import to_dict
from roder_api.errors import StoreCorruptedError, StoreError
from roder_api.threads import ThreadMetadata
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._format import encode_record

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_the_next_write_moves_a_torn_tail_to_quarantine_and_says_so(
    factory: JsonlThreadStoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    path = await journal_with(factory, "torn", 3)
    intact = path.read_bytes()
    torn = encode_record({"v": 1, "k": "events", "seq": 4, "t": 5, "events": []})[:37]
    path.write_bytes(intact + torn)
    store = await factory.open()
    with caplog.at_level(logging.WARNING, logger="roder.jsonl"):
        events = await store.read_events("torn")
        assert [e.sequence for e in events] == [1, 2, 3]
        assert caplog.text == ""  # reading says nothing and cuts nothing
        assert path.read_bytes() == intact + torn
        assert [e.sequence for e in await store.append_events("torn", [msg(9)])] == [4]
    assert f"cut a torn last line 5 ({len(torn)} bytes moved to" in caplog.text
    assert str(path) in caplog.text
    assert path.read_bytes().startswith(intact)
    assert (await store.get_thread("torn")).last_sequence == 4
    await store.aclose()


async def test_garbage_after_the_last_line_is_skipped_then_moved(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "junk", 2)
    intact = path.read_bytes()
    path.write_bytes(intact + b"\x00\x00\x00garbage")
    store = await factory.open()
    assert (await store.get_thread("junk")).last_sequence == 2
    assert path.read_bytes() == intact + b"\x00\x00\x00garbage"
    await store.update_thread("junk", title="written")
    assert path.read_bytes().startswith(intact) and b"garbage" not in path.read_bytes()
    (quarantine,) = path.parent.glob("junk.jsonl.quarantine-*")
    assert quarantine.read_bytes() == b"\x00\x00\x00garbage"
    await store.aclose()


async def test_an_unterminated_last_line_is_a_torn_write_never_acknowledged(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "nl", 1)
    # The next commit's line, written by nobody the index heard of: a line the index knows
    # was acknowledged, and losing its last byte is damage (a shorter journal), not this.
    line = encode_record({"v": 1, "k": "events", "seq": 2, "t": 5, "events": [to_dict(msg(1))]})
    torn = path.read_bytes() + line[:-1]
    path.write_bytes(torn)
    store = await factory.open()
    # The commit's one write ends with the newline: without it the write never completed.
    assert [e.sequence for e in await store.read_events("nl")] == [1]
    assert path.read_bytes() == torn
    await store.aclose()


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-store", "same-store"])
async def test_mid_file_damage_names_file_and_line_and_cuts_nothing(
    factory: JsonlThreadStoreFactory, fresh: bool
) -> None:
    store = await factory.open()
    await store.create_thread(ThreadMetadata("mid", 1000, 1000))
    for i in range(4):
        await store.append_events("mid", [msg(i)])
    path = store.journal_path("mid")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:10] + b"#" + lines[2][11:]  # line 3: a flipped byte in the framing
    damaged = b"\n".join(lines)
    path.write_bytes(damaged)
    if fresh:
        await store.aclose()
        store = await factory.open()
    with pytest.raises(StoreCorruptedError) as info:
        await store.read_events("mid")
    assert info.value.line == 3 and str(path) in str(info.value)
    assert "roder fsck --repair" in str(info.value)
    with pytest.raises(StoreCorruptedError):
        await store.append_events("mid", [msg(9)])
    assert path.read_bytes() == damaged
    await store.aclose()


async def test_damage_found_when_the_journal_is_scanned_is_refused(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "scan", 3)
    (factory.base_path / "index.sqlite3").unlink()  # no index: the open scans every line
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"message 0", b"messagX 0")  # checksum mismatch, line 2
    path.write_bytes(b"\n".join(lines))
    store = await factory.open()
    with pytest.raises(StoreCorruptedError) as info:
        await store.get_thread("scan")
    assert info.value.line == 2
    await store.aclose()


async def test_a_newer_major_version_is_refused_and_kept(factory: JsonlThreadStoreFactory) -> None:
    path = await journal_with(factory, "v2", 1)
    newer = encode_record({"v": 2, "k": "events", "seq": 2, "t": 1, "events": []})
    path.write_bytes(path.read_bytes() + newer)
    before = path.read_bytes()
    store = await factory.open()
    with pytest.raises(StoreError, match=r"format version 2 by a newer Roder.*upgrade roder"):
        await store.read_events("v2")
    with pytest.raises(StoreError, match="newer Roder"):
        await store.append_events("v2", [msg(1)])
    assert path.read_bytes() == before
    await store.aclose()


async def test_records_of_an_unknown_kind_in_the_same_major_version_are_skipped(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "ext", 1)
    path.write_bytes(path.read_bytes() + encode_record({"v": 1, "k": "bookmark", "at": 1}))
    store = await factory.open()
    assert [e.sequence for e in await store.read_events("ext")] == [1]
    assert [e.sequence for e in await store.append_events("ext", [msg(2)])] == [2]
    await store.aclose()
