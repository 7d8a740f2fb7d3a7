"""``Runtime.persist_turn_items`` (one durable batch) and the collector pause of bulk reads."""

from __future__ import annotations

import gc
import sysconfig
import threading
import weakref
from pathlib import Path

import pytest

from roder_api.codec import gc_paused
from roder_api.errors import UnserializableEventError
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.transcript import ProviderMetadata, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.core


def _runtime(base: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base))
    return Runtime(builder.build(), RuntimeConfig())


@pytest.mark.anyio
async def test_persist_turn_items_is_one_atomic_batch(tmp_path: Path) -> None:
    async with _runtime(tmp_path / "store") as runtime:
        tid = (await runtime.create_thread()).thread_id
        items = [UserMessage(f"m{i}") for i in range(5)]
        entries = await runtime.persist_turn_items(tid, "turn-1", items)
        assert [e.sequence for e in entries] == [1, 2, 3, 4, 5]
        bad = [UserMessage("kept?"), ProviderMetadata({"x": object()})]
        with pytest.raises(UnserializableEventError, match=r"event 1 of this batch: item\.data\.x"):
            await runtime.persist_turn_items(tid, "turn-2", bad)
        assert await runtime.persist_turn_items(tid, "turn-2", []) == []
        snapshot = await runtime.load_thread(tid)
        assert snapshot is not None and snapshot.items == items
        assert [t.turn_id for t in snapshot.turns] == ["turn-1"]
        assert gc.isenabled(), "load_thread left the garbage collector off"
        assert await runtime.replay_history(tid) == items
        assert gc.isenabled()


def test_gc_paused_nests_and_resumes_once() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner holder resumed the collector too early"
    assert gc.isenabled()


def test_gc_paused_leaves_an_application_choice_alone() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled(), "the collector was turned on against the application's wish"
    finally:
        gc.enable()


def test_gc_paused_across_threads_resumes_when_the_last_leaves() -> None:
    entered = threading.Barrier(3)
    leave_first = threading.Event()
    first_left = threading.Event()
    states: list[bool] = []

    def first() -> None:
        with gc_paused():
            entered.wait(timeout=10)
            leave_first.wait(timeout=10)
        first_left.set()

    def second() -> None:
        with gc_paused():
            entered.wait(timeout=10)
            leave_first.set()
            first_left.wait(timeout=10)
            states.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    entered.wait(timeout=10)
    for thread in threads:
        thread.join(timeout=10)
    assert states == [False], "the collector resumed while a holder was still decoding"
    assert gc.isenabled()


@pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="the free-threaded build leaves the collector's generations as they are",
)
def test_gc_paused_leaves_no_young_pass_over_what_was_decoded() -> None:
    passes: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.collect()
    with gc_paused():
        kept = [[i] for i in range(30_000)]  # tracked containers, as decoded records are
        gc.callbacks.append(watch)
    try:
        more = [[1], [2], [3]]  # the next allocations after the pause
    finally:
        gc.callbacks.remove(watch)
    assert passes == [], "a collection walked the decoded objects right after the pause"
    assert gc.isenabled() and len(kept) == 30_000 and len(more) == 3


def test_gc_paused_after_a_small_decode_leaves_the_young_generation_to_its_pass() -> None:
    # A replay before a turn decodes little: its young objects are not moved to the oldest
    # generation (where short-lived cycles would wait for a full collection); the usual
    # young pass walks them.
    passes: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    try:
        with gc_paused():
            kept = [[i] for i in range(1_000)]
            gc.callbacks.append(watch)
        try:
            more = [[1], [2], [3]]
        finally:
            gc.callbacks.remove(watch)
    finally:
        gc.set_threshold(*thresholds)
    assert 0 in passes, "the young objects of a small decode skipped their young pass"
    assert len(kept) == 1_000 and len(more) == 3


class _Node:
    def __init__(self) -> None:
        self.itself = self


def test_gc_paused_still_lets_the_collector_free_cycles_made_meanwhile() -> None:
    with gc_paused():
        node = _Node()
        ref = weakref.ref(node)
        del node
    assert ref() is not None  # a cycle: reference counting alone cannot free it
    gc.collect()
    assert ref() is None


def test_gc_paused_leaves_what_the_application_froze_frozen() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            kept = [[i] for i in range(1000)]
        assert gc.get_freeze_count() == frozen, "the application's frozen objects were thawed"
        assert len(kept) == 1000
    finally:
        gc.unfreeze()
