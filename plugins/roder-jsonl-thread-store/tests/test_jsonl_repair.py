"""The JSONL store's check and repair functions (what ``roder fsck`` calls)."""

from __future__ import annotations

import pytest
from jsonl_helpers import journal_with, msg

from roder_api.errors import ThreadNotFoundError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._format import encode_record

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_healthy_thread_checks_ok(factory: JsonlThreadStoreFactory) -> None:
    await journal_with(factory, "ok", 3)
    store = await factory.open()
    check = await store.check_thread("ok")
    assert check.ok and check.damage is None and check.index == "ok"
    assert check.lines == 4 and check.last_sequence == 3 and check.describe() == "ok"
    assert (await store.repair_thread("ok")).changed is False
    assert await store.journal_ids() == ["ok"]
    await store.aclose()


def test_the_check_results_are_importable_from_the_package_as_before() -> None:
    # fsck's module is imported on first use (PEP 562): the names keep their homes.
    import roder_jsonl_thread_store
    from roder_jsonl_thread_store import _store

    for name in ("ThreadCheck", "ThreadRepair"):
        assert name in dir(roder_jsonl_thread_store)
        value = getattr(roder_jsonl_thread_store, name)
        assert value is getattr(_store, name) and value.__module__.endswith("._fsck")
    with pytest.raises(AttributeError, match="no attribute 'ThreadChecks'"):
        roder_jsonl_thread_store.ThreadChecks  # noqa: B018


async def test_a_sequence_gap_is_found_and_its_tail_quarantined(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "gap", 2)
    intact = path.read_bytes()
    gap = encode_record({"v": 1, "k": "events", "seq": 9, "t": 5, "events": [{"type": "x"}]})
    after = encode_record({"v": 1, "k": "meta", "t": 6, "title": "later"})
    path.write_bytes(intact + gap + after)
    store = await factory.open()
    check = await store.check_thread("gap")
    assert check.damage is not None and check.damage.kind == "sequence"
    assert check.damage.line == 4 and not check.ok
    repair = await store.repair_thread("gap")
    assert repair.quarantine is not None and repair.bytes_moved == len(gap + after)
    assert repair.quarantine.read_bytes() == gap + after
    assert path.read_bytes() == intact
    assert (await store.check_thread("gap")).ok
    assert [e.sequence for e in await store.append_events("gap", [msg(3)])] == [3]
    await store.aclose()


async def test_a_journal_without_a_valid_first_line_is_set_aside_whole(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "head", 1)
    damaged = b"garbage\n" + path.read_bytes().split(b"\n", 1)[1]
    path.write_bytes(damaged)
    store = await factory.open()
    assert (await store.check_thread("head")).damage is not None
    repair = await store.repair_thread("head")
    assert repair.journal_removed and repair.quarantine is not None
    assert repair.quarantine.read_bytes() == damaged and not path.exists()
    with pytest.raises(ThreadNotFoundError):
        await store.get_thread("head")
    assert (await store.list_threads()).threads == ()
    await store.aclose()


async def test_a_newer_format_is_reported_but_never_repaired(
    factory: JsonlThreadStoreFactory,
) -> None:
    path = await journal_with(factory, "new", 1)
    path.write_bytes(path.read_bytes() + encode_record({"v": 3, "k": "events"}))
    before = path.read_bytes()
    store = await factory.open()
    check = await store.check_thread("new")
    assert check.damage is not None and check.damage.kind == "newer_version"
    repair = await store.repair_thread("new")
    assert repair.unrepaired and "newer Roder" in repair.unrepaired
    assert path.read_bytes() == before
    await store.aclose()


async def test_reindex_rebuilds_every_row(factory: JsonlThreadStoreFactory) -> None:
    await journal_with(factory, "a", 1)
    await journal_with(factory, "b", 2)
    store = await factory.open()
    assert await store.reindex() == 2
    assert {m.thread_id: m.item_count for m in (await store.list_threads()).threads} == {
        "a": 1,
        "b": 2,
    }
    assert await store.thread_size_bytes("a") == store.journal_path("a").stat().st_size
    await store.aclose()


async def test_what_a_commit_records_equals_what_a_scan_finds(
    factory: JsonlThreadStoreFactory,
) -> None:
    from roder_api.events import JournalEvent, UsageUpdated
    from roder_api.inference import TokenUsage
    from roder_api.transcript import ContextCompaction

    store = await factory.open()
    await store.create_thread(ThreadMetadata("fold", 1000, 1000, title="t", extra={"k": 1}))
    await store.append_events("fold", [msg(1), UsageUpdated("turn", TokenUsage(5, 2, 7, 1))])
    await store.append_events("fold", [ItemCompleted("turn", ContextCompaction("s")), msg(2)])
    await store.update_thread("fold", title="renamed")
    await store.import_events("fold", [JournalEvent(5, 10**13, msg(3))])
    committed = await store.get_thread("fold")
    # The index row written by the commits equals a full scan of the journal.
    assert (await store.check_thread("fold")).index == "ok"
    await store.aclose()
    (factory.base_path / "index.sqlite3").unlink()
    store = await factory.open()
    assert await store.get_thread("fold") == committed
    assert committed.usage.total_tokens == 7 and committed.item_count == 4
    assert committed.title == "renamed" and committed.updated_at_ms == 10**13
    assert [e.sequence for e in await store.replay_events("fold")] == [3, 4, 5]
    await store.aclose()
