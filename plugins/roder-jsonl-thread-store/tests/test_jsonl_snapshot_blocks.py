"""``read_snapshot`` frames the journal a block of lines at a time (``_turns``): it answers
what folding ``read_events`` answers, whatever the block size, and damage the index cannot
see (an edit that kept the journal's size) is reported at the same line, with the same
reason, as the line-at-a-time read of events reports it."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonl_helpers import msg

from roder_api.errors import StoreCorruptedError
from roder_api.events import Event, ItemCompleted, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata, Turn, turns_from_events
from roder_api.transcript import ProviderMetadata, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory, _turns

pytestmark = [pytest.mark.anyio, pytest.mark.core]

# Blocks smaller than a line, of a few lines, and the default.
BLOCKS = [64, 700, _turns.READ_CHUNK]
BIG = 2**70 + 1  # read back as a float (not equal to it) by anything but the exact decoder


def _batches() -> list[list[Event]]:
    batches: list[list[Event]] = [[msg(i, size=(i % 5) * 40)] for i in range(40)]
    batches[7] = [msg(7, size=900)]  # a line longer than the small blocks
    # Needs the codec's exact path (an integer beyond 64 bits): the record starts with its mark.
    batches[12] = [ItemCompleted("turn-2", ProviderMetadata({"big": BIG}))]
    batches[20] = [UsageUpdated("turn-2", TokenUsage(1, 2, 3))]
    batches[25] = [ItemCompleted("turn-3", UserMessage("a")), msg(25), msg(26)]
    return batches


async def _journal(factory: JsonlThreadStoreFactory) -> Path:
    store = await factory.open()
    await store.create_thread(ThreadMetadata("t", 1000, 1000))
    for batch in _batches():
        await store.append_events("t", batch)
    path = store.journal_path("t")
    await store.aclose()
    return path


@pytest.mark.parametrize("block", BLOCKS)
async def test_the_snapshot_is_the_fold_of_the_events_whatever_the_block_size(
    factory: JsonlThreadStoreFactory, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    await _journal(factory)
    monkeypatch.setattr(_turns, "READ_CHUNK", block)
    store = await factory.open()
    try:
        snapshot = await store.read_snapshot("t")
        assert snapshot.turns == turns_from_events(await store.read_events("t"))
        assert ProviderMetadata({"big": BIG}) in snapshot.items  # read exactly, not a float
        assert [t.turn_id for t in snapshot.turns] == ["turn", "turn-2", "turn", "turn-3", "turn"]
    finally:
        await store.aclose()


def _flip(data: bytes, line: int) -> bytes:
    """Flip one bit inside the record of 1-based ``line``: the same size, a bad checksum."""
    start = 0
    for _ in range(line - 1):
        start = data.index(b"\n", start) + 1
    position = start + data[start:].index(b"message") + 2
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def _swap(data: bytes, line: int) -> bytes:
    """Swap 1-based ``line`` and the one after it (both intact, out of order)."""
    lines = data.splitlines(keepends=True)
    lines[line - 1], lines[line] = lines[line], lines[line - 1]
    return b"".join(lines)


async def _error(factory: JsonlThreadStoreFactory, read: str) -> str:
    store = await factory.open()  # a fresh store: the index row vouches for the size only
    try:
        with pytest.raises(StoreCorruptedError) as caught:
            if read == "snapshot":
                await store.read_snapshot("t")
            else:
                await store.read_events("t")
        return str(caught.value)
    finally:
        await store.aclose()


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(
    ("edit", "line"),
    [(_flip, 2), (_flip, 9), (_flip, 30), (_flip, 40), (_swap, 3), (_swap, 35)],
)
async def test_damage_of_the_same_size_is_reported_where_the_read_of_events_reports_it(
    factory: JsonlThreadStoreFactory,
    monkeypatch: pytest.MonkeyPatch,
    block: int,
    edit: object,
    line: int,
) -> None:
    path = await _journal(factory)
    assert callable(edit)
    damaged = edit(path.read_bytes(), line)
    assert len(damaged) == path.stat().st_size
    with path.open("r+b") as file:  # in place: the same inode, the same size
        file.write(damaged)
    monkeypatch.setattr(_turns, "READ_CHUNK", block)
    snapshot_error = await _error(factory, "snapshot")
    assert f"line {line}" in snapshot_error
    assert snapshot_error == await _error(factory, "events")


def test_the_snapshot_pass_builds_real_turns() -> None:
    items = (UserMessage("a"), UserMessage("b"))
    built, made = _turns._new_turn("turn-1", items), Turn("turn-1", items)
    assert type(built) is Turn
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)


@pytest.mark.parametrize("block", BLOCKS)
async def test_checksums_spelled_in_capitals_are_read_as_the_events_read_them(
    factory: JsonlThreadStoreFactory, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    path = await _journal(factory)
    lines = path.read_bytes().splitlines(keepends=True)
    start, end = len(b'{"c":"'), len(b'{"c":"') + 8
    upper = [line[:start] + line[start:end].upper() + line[end:] for line in lines]
    assert upper != lines  # some checksum has a hex letter
    with path.open("r+b") as file:  # in place: the same inode, the same size
        file.write(b"".join(upper))
    monkeypatch.setattr(_turns, "READ_CHUNK", block)
    store = await factory.open()
    try:
        snapshot = await store.read_snapshot("t")
        assert snapshot.turns == turns_from_events(await store.read_events("t"))
        assert len(snapshot.items) == 41
    finally:
        await store.aclose()
