"""Hostile input: damaged journals, tricky thread ids and titles, bad TOML, bad events.

Hypothesis damages a journal (truncation, bit flips, duplicated and reordered lines) and a
fresh store must never raise anything but a ``RoderError``, never lose a record before the
damage, and never return data that was not written. Thread ids with path tricks or control
characters are refused before anything touches the disk; titles of any text round-trip or
are refused clearly; malformed or hostile TOML is a ``ConfigError``; events JSON cannot
carry are an ``UnserializableEventError`` with nothing stored.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from _torture import hostile, reorder
from _torture.stats import KindStats
from _torture.stores import StoreSpec, drop_schema, installed_backends, postgres_dsn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roder_api.errors import (
    ConfigError,
    InvalidThreadIdError,
    UnserializableEventError,
)
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.threads import ThreadMetadata, ThreadStore
from roder_api.transcript import ToolResultRecord, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import load_config

BACKENDS = ["asyncio", "trio"]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _spec(path: Path) -> StoreSpec:
    return StoreSpec("jsonl", "jsonl", {"path": str(path)})


@dataclass(frozen=True)
class Template:
    """One journal built through the store, damaged afresh for every example."""

    dir: Path
    path: Path
    events: list[JournalEvent]
    original: bytes


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    """Return a journal of a few batches and a title, built once for the module."""
    base = tmp_path_factory.mktemp("hostile-template")
    path, events = anyio.run(hostile.build_journal, _spec(base))
    return Template(base, path, events, path.read_bytes())


mutations = st.builds(
    hostile.Mutation,
    st.sampled_from(["truncate", "flip", "duplicate", "swap"]),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 20),
)


@pytest.mark.parametrize("backend", BACKENDS)
@FAST
@given(mutation=mutations)
def test_a_damaged_journal_never_crashes_or_loses_what_came_before(
    template: Template, backend: str, mutation: hostile.Mutation
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "store"
        spec = _spec(base)
        target = base / template.path.relative_to(template.dir)
        target.parent.mkdir(parents=True)
        stats = KindStats("hostile")
        anyio.run(
            hostile.check_mutation,
            stats,
            spec,
            target,
            template.original,
            template.events,
            mutation,
            backend=backend,
        )
    assert stats.problems == []


@pytest.mark.anyio
async def test_fsck_reports_every_damage_and_repair_keeps_what_came_before(
    tmp_path: Path,
) -> None:
    if not hostile.fsck_available():
        pytest.skip("`roder fsck` has not landed yet")
    stats = await hostile.run_hostile(_spec, tmp_path, 40, seed=4, fsck=hostile.store_fsck)
    assert stats.problems == []
    assert stats.notes.get("fsck reported", 0) >= 10
    assert stats.notes.get("repaired", 0) >= 10


@pytest.mark.anyio
async def test_the_fsck_command_reports_damage(tmp_path: Path) -> None:
    if not hostile.fsck_available():
        pytest.skip("`roder fsck` has not landed yet")
    stats = await hostile.run_hostile(_spec, tmp_path, 3, seed=9, fsck=hostile.cli_fsck)
    assert stats.problems == []


@pytest.mark.anyio
async def test_reordered_and_cut_journals_are_refused_and_reported(tmp_path: Path) -> None:
    """The torture kind of issue 21 item 13: intact lines, wrong order or a clean cut."""
    stats = await reorder.run_reordered(_spec, tmp_path, 24, seed=3)
    assert stats.problems == []
    assert stats.trials == 24 and stats.ok


# --- thread ids and titles ----------------------------------------------------------------------

TRICKY_IDS = [
    "",
    ".",
    "..",
    "../escape",
    "a/../../escape",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "-rf",
    ".hidden",
    "a\x00b",
    "a\nb",
    "tab\there",
    "\x1b[31mred",
    "é",
    "ａ",  # a full-width letter that looks like "a"
    "x" * 129,
    "x" * 100_000,
    " lead",
    "trail ",
]


@pytest.fixture(params=["jsonl", "sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ThreadStore]:
    """Return an open store of each installed backend (PostgreSQL in a fresh schema)."""
    backend = str(request.param)
    if backend != "jsonl" and backend not in installed_backends():
        pytest.skip(f"the {backend} store is not installed")
    settings: dict[str, Any] = {"path": str(tmp_path / "store")}
    if backend == "sqlite":
        settings = {"path": str(tmp_path / "roder.db")}
    dsn = None
    if backend == "postgres":
        dsn = await anyio.to_thread.run_sync(postgres_dsn)
        if dsn is None:
            pytest.skip("PostgreSQL is not reachable")
        settings = {"dsn": dsn, "schema": f"torture_{uuid.uuid4().hex[:12]}"}
    store = await StoreSpec(backend, backend, settings).factory().open()
    try:
        yield store
    finally:
        await store.aclose()
        if dsn is not None:
            await anyio.to_thread.run_sync(drop_schema, dsn, settings["schema"])


def _tree(path: Path) -> list[str]:
    return sorted(str(p) for p in path.rglob("*"))


@pytest.mark.anyio
@pytest.mark.parametrize("thread_id", TRICKY_IDS, ids=lambda t: repr(t)[:20])
async def test_tricky_thread_ids_are_refused_before_touching_the_disk(
    any_store: ThreadStore, tmp_path: Path, thread_id: str
) -> None:
    before = await anyio.to_thread.run_sync(_tree, tmp_path)
    with pytest.raises(InvalidThreadIdError):
        await any_store.create_thread(ThreadMetadata(thread_id, 0, 0))
    for call in (
        any_store.get_thread(thread_id),
        any_store.read_events(thread_id),
        any_store.append_events(thread_id, [ItemCompleted("t", UserMessage("x"))]),
        any_store.delete_thread(thread_id),
    ):
        with pytest.raises(InvalidThreadIdError):
            await call
    assert await anyio.to_thread.run_sync(_tree, tmp_path) == before


@pytest.mark.parametrize("backend", BACKENDS)
@FAST
@given(thread_id=st.text(max_size=200))
def test_any_text_as_a_thread_id_stays_inside_the_store(backend: str, thread_id: str) -> None:
    async def check(base: Path) -> None:
        store = await JsonlThreadStoreFactory(base).open()
        try:
            await store.create_thread(ThreadMetadata(thread_id, 0, 0))
        except InvalidThreadIdError:
            return
        finally:
            await store.aclose()
        journal = store.journal_path(thread_id).resolve()
        assert journal.parent == (base / "threads").resolve()
        assert thread_id in journal.name

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(check, Path(tmp), backend=backend)


titles = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp"])),
    st.sampled_from(["../../etc/passwd", "\x00", '\r\n{"c":"00000000"}\n', "\u2028", "é" * 10]),
)


@pytest.mark.parametrize("backend", BACKENDS)
@FAST
@given(title=titles)
def test_titles_of_any_text_round_trip(backend: str, title: str) -> None:
    async def check(base: Path) -> None:
        factory = JsonlThreadStoreFactory(base)
        store = await factory.open()
        await store.create_thread(ThreadMetadata("t1", 0, 0, title=title))
        await store.update_thread("t1", title=title + "!")
        await store.append_events("t1", [ItemCompleted("t", UserMessage(title))])
        await store.aclose()
        fresh = await factory.open()
        metadata = await fresh.get_thread("t1")
        (entry,) = await fresh.read_events("t1")
        await fresh.aclose()
        assert metadata.title == title + "!"
        assert isinstance(entry.event, ItemCompleted)
        assert entry.event.item == UserMessage(title)

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(check, Path(tmp), backend=backend)


@pytest.mark.anyio
async def test_a_huge_title_and_message_round_trip(any_store: ThreadStore) -> None:
    huge = "\x01é\n\u2028\t" * 1_000_000  # ~7 MB with control characters and newlines
    await any_store.create_thread(ThreadMetadata("big", 0, 0, title=huge))
    await any_store.append_events("big", [ItemCompleted("t", UserMessage(huge))])
    assert (await any_store.get_thread("big")).title == huge
    (entry,) = await any_store.read_events("big")
    assert isinstance(entry.event, ItemCompleted) and entry.event.item == UserMessage(huge)


# --- configuration ------------------------------------------------------------------------------


def _load(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(data)
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        assert str(path) in str(exc)


@FAST
@given(data=st.binary(max_size=400))
def test_random_bytes_as_config_are_a_config_error_or_fine(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _load(Path(tmp), data)


toml_fragments = st.lists(
    st.sampled_from(
        [
            "max_input_bytes = ",
            "turn_timeout_s = ",
            "[reliability]",
            "[thread_store]",
            "[engines.x]",
            "[[engines]]",
            "provider_retry_max_attempts = ",
            "default_engine = ",
            "1",
            "-1",
            "nan",
            "inf",
            "1e999",
            "99999999999999999999",
            "true",
            '"text"',
            "'''",
            "[",
            "]",
            "{",
            "}",
            "=",
            "\n",
            "\x00",
            "é",
            "a.b.c",
        ]
    ),
    max_size=30,
).map("".join)


@FAST
@given(text=toml_fragments)
def test_malformed_toml_is_a_config_error_or_fine(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _load(Path(tmp), text.encode())


@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * 100_000 + "]" * 100_000,
        "a = " + "{b=" * 20_000 + "1" + "}" * 20_000,
        "x" * 5_000_000,
        "[" + "a." * 10_000 + "a]",
        "default_model = '" + "m" * 5_000_000,
        "turn_timeout_s = nan",
        "turn_timeout_s = -inf",
        "max_input_bytes = 0",
    ],
    ids=[
        "deep-arrays",
        "deep-tables",
        "huge-garbage",
        "huge-dotted",
        "unterminated",
        "nan",
        "neg-inf",
        "zero",
    ],
)
def test_hostile_toml_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(path) in str(caught.value)


def test_a_huge_valid_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "default_model = '"
        + "m" * 5_000_000
        + "'\n[engines.x]\n"
        + "".join(f"k{i} = {i}\n" for i in range(50_000))
    )
    config = load_config(path, environ={})
    assert config.default_model is not None and len(config.default_model) == 5_000_000
    assert len(config.engines["x"]) == 50_000


# --- events that cannot be serialised -------------------------------------------------------------


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep() -> list[Any]:
    top: list[Any] = []
    current = top
    for _ in range(20_000):
        child: list[Any] = []
        current.append(child)
        current = child
    return top


UNSERIALISABLE = {
    "object": object(),
    "set": {1, 2},
    "bytes": b"raw",
    "nan": math.nan,
    "infinity": math.inf,
    "int key": {1: "a"},
    "tuple key": {(1, 2): "a"},
    "circular": _circular(),
    "deeply nested": _deep(),
}


@pytest.mark.anyio
@pytest.mark.parametrize("value", list(UNSERIALISABLE.values()), ids=list(UNSERIALISABLE))
async def test_unserialisable_events_store_nothing(any_store: ThreadStore, value: object) -> None:
    await any_store.create_thread(ThreadMetadata("u", 0, 0))
    good = ItemCompleted("t", UserMessage("kept"))
    bad = ItemCompleted("t", ToolResultRecord("1", "tool", "r", display_payload=value))
    with pytest.raises(UnserializableEventError):
        await any_store.append_events("u", [good, bad])
    assert await any_store.read_events("u") == []
    (entry,) = await any_store.append_events("u", [good])
    assert entry.sequence == 1


@pytest.mark.anyio
async def test_what_stdlib_json_carries_is_kept(any_store: ThreadStore) -> None:
    # The value rule: lone surrogates and integers beyond 64 bits are JSON data.
    await any_store.create_thread(ThreadMetadata("u", 0, 0))
    events = [
        ItemCompleted("t", UserMessage("\udfff")),
        ItemCompleted("t", ToolResultRecord("1", "tool", "r", display_payload=2**64)),
    ]
    await any_store.append_events("u", events)
    assert [entry.event for entry in await any_store.read_events("u")] == events
