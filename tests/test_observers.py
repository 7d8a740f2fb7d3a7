"""The observer seam: persisted batches reach observers, which never block or fail a turn."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from roder_api.events import JournalEvent, TurnComplete, TurnStarted
from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_runtime.store._observers import ObserverHub

pytestmark = [pytest.mark.anyio, pytest.mark.core]


class Recording:
    """Keeps every batch; closing is noted."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[JournalEvent]]] = []
        self.closed = False
        self.thread: str | None = None

    async def observe(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        self.thread = threading.current_thread().name
        self.batches.append((thread_id, list(events)))

    async def aclose(self) -> None:
        self.closed = True


class Slow(Recording):
    """Blocks its thread for a long time on every batch (a stuck exporter)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    async def observe(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        self.release.wait(30)  # blocking on purpose: it must not stall the turn's loop
        await super().observe(thread_id, events)


class Raising(Recording):
    """Raises on every batch."""

    async def observe(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        await super().observe(thread_id, events)
        raise RuntimeError("observer bug")


def _runtime(base: Path, *observers: Recording) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    for observer in observers:
        builder.observer(observer)
    return Runtime(builder.build(), RuntimeConfig())


async def test_an_observer_sees_every_persisted_event_in_order(tmp_path: Path) -> None:
    seen = Recording()
    runtime = _runtime(tmp_path / "threads", seen)
    async with runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "hello there") == "You said: hello there"
        journal = await (await runtime.journal(thread_id)).read_events()
    assert seen.closed
    observed = [e for tid, batch in seen.batches for e in batch if tid == thread_id]
    assert observed == journal
    assert isinstance(observed[0].event, TurnStarted)
    assert isinstance(observed[-1].event, TurnComplete)
    assert seen.thread == "roder-observer"


async def test_a_slow_observer_never_blocks_a_turn(tmp_path: Path) -> None:
    release = threading.Event()
    slow = Slow(release)
    runtime = _runtime(tmp_path / "threads", slow)
    assert runtime.observers is not None
    try:
        thread_id = (await runtime.create_thread()).thread_id
        started = time.monotonic()
        for n in range(3):
            assert await runtime.run_turn(thread_id, f"turn {n}") == f"You said: turn {n}"
        assert time.monotonic() - started < 10  # the observer is stuck for 30 s
        assert slow.batches == []
    finally:
        release.set()
        await runtime.aclose()
    assert slow.closed and slow.batches  # what was queued was handed over before closing


async def test_a_full_queue_drops_batches_counted(tmp_path: Path) -> None:
    release = threading.Event()
    slow = Slow(release)
    hub = ObserverHub([slow], queue_batches=2)
    for n in range(6):
        hub.offer("t", [JournalEvent(n + 1, 0, TurnStarted(f"turn{n}"))])
    release.set()
    await hub.aclose()
    # One batch may be taken by the observer before the queue fills; the rest overflow.
    assert hub.dropped in (3, 4)
    assert len(slow.batches) == 6 - hub.dropped


async def test_a_raising_observer_never_fails_a_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raising, recording = Raising(), Recording()
    runtime = _runtime(tmp_path / "threads", raising, recording)
    async with runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "one") == "You said: one"
        assert await runtime.run_turn(thread_id, "two") == "You said: two"
        hub = runtime.observers
        assert hub is not None
    assert hub.failures == len(raising.batches) > 0
    assert raising.closed and recording.closed
    assert len(recording.batches) == len(raising.batches)
    assert "observer Raising failed on a batch" in caplog.text


def test_builder_refuses_what_is_not_an_observer() -> None:
    with pytest.raises(TypeError, match="not an observer"):
        ExtensionRegistryBuilder().observer(object())  # type: ignore[arg-type]
