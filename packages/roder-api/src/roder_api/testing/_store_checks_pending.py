"""Store checks: ``threads_with_pending_input`` finds every thread with a turn left open.

What a server restarted after a crash opens sessions on: a run accepted (or started) and
not ended is found however many events its turn journaled since, and a thread whose turns
all ended is not.
"""

from __future__ import annotations

import pytest

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    Event,
    InputAccepted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.testing._kit_support import make_metadata, user_item
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadStore, ThreadStoreFactory

LONG_TURN_EVENTS = 200
"""Events a long turn journals after its input was accepted (more than any fixed tail)."""


def _deltas(turn_id: str, count: int) -> list[Event]:
    return [
        AssistantContentDelta(turn_id, "step-1", ContentPhase.FINAL_ANSWER, f"word{i} ")
        for i in range(count)
    ]


async def _thread(store: ThreadStore, created_at_ms: int, *batches: list[Event]) -> str:
    tid = (await store.create_thread(make_metadata(created_at_ms=created_at_ms))).thread_id
    for batch in batches:
        await store.append_events(tid, batch)
    return tid


async def _turn_threads(store: ThreadStore) -> dict[str, str]:
    """Create one thread of each kind; return ``kind -> thread id``."""
    long_events = _deltas("r1", LONG_TURN_EVENTS)
    return {
        # r1 accepted and started, 200 events of its reply journaled (in batches), r2 queued.
        "long": await _thread(
            store,
            1000,
            [InputAccepted("r1", "tell a long story"), TurnStarted("r1")],
            [InputAccepted("r2", "and another")],
            *[long_events[i : i + 25] for i in range(0, len(long_events), 25)],
        ),
        # every turn ended (one completed, one aborted, one steered while it ran)
        "ended": await _thread(
            store,
            2000,
            [InputAccepted("a", "hi"), TurnStarted("a"), user_item("hi", "a")],
            [InputAccepted("a", "also this", steer=True), TurnComplete("a", "hello")],
            [TurnStarted("b"), *_deltas("b", 3), TurnAborted("b", "interrupted")],
        ),
        # a turn ended, then new input was accepted and nothing more
        "again": await _thread(
            store,
            3000,
            [TurnStarted("c"), user_item("one", "c"), TurnComplete("c")],
            [InputAccepted("d", "two")],
        ),
        # only accepted input (the process died before the turn started)
        "accepted": await _thread(store, 4000, [InputAccepted("e", "queued")]),
        # a thread with no events at all
        "empty": await _thread(store, 5000),
    }


class PendingInputChecks(StoreKitBase):
    """Checks of ``threads_with_pending_input`` and of ``ThreadMetadata.open_turns``."""

    async def test_pending_input_is_found_after_a_long_turn(
        self, thread_store: ThreadStore
    ) -> None:
        """Input accepted and not answered is found after 200 more events of its turn; a
        thread whose turns all ended is not; one that got new input after its turn ended is."""
        threads = await _turn_threads(thread_store)
        found = await thread_store.threads_with_pending_input()
        expected = {threads["long"], threads["again"], threads["accepted"]}
        assert set(found) == expected, {k: v in found for k, v in threads.items()}
        assert len(found) == len(set(found)), f"a thread listed twice: {found}"

    async def test_pending_input_newest_first_and_bounded(self, thread_store: ThreadStore) -> None:
        """Newest update first; ``limit`` caps the answer; ``updated_after_ms`` skips older."""
        threads = await _turn_threads(thread_store)
        found = await thread_store.threads_with_pending_input()
        updated = {tid: (await thread_store.get_thread(tid)).updated_at_ms for tid in found}
        assert [updated[tid] for tid in found] == sorted(updated.values(), reverse=True)
        assert await thread_store.threads_with_pending_input(limit=1) == found[:1]
        newest = max(updated.values())
        after = await thread_store.threads_with_pending_input(updated_after_ms=newest + 60_000)
        assert after == [], "threads updated before updated_after_ms were listed"
        assert threads["ended"] not in found

    async def test_open_turns_are_folded_into_metadata(self, thread_store: ThreadStore) -> None:
        """``ThreadMetadata.open_turns``: the turns accepted or started and not ended, in
        the order they opened; a steer opens none; ended turns leave it."""
        threads = await _turn_threads(thread_store)
        opened = {k: (await thread_store.get_thread(v)).open_turns for k, v in threads.items()}
        assert opened == {
            "long": ("r1", "r2"),
            "ended": (),
            "again": ("d",),
            "accepted": ("e",),
            "empty": (),
        }
        tid = threads["long"]
        await thread_store.append_events(tid, [TurnComplete("r1"), TurnStarted("r2")])
        assert (await thread_store.get_thread(tid)).open_turns == ("r2",)
        assert tid in await thread_store.threads_with_pending_input()
        await thread_store.append_events(tid, [TurnAborted("r2", "process_exited")])
        assert (await thread_store.get_thread(tid)).open_turns == ()
        assert tid not in await thread_store.threads_with_pending_input()
        listed = {m.thread_id: m.open_turns for m in (await thread_store.list_threads()).threads}
        assert listed[threads["again"]] == ("d",) and listed[tid] == ()

    async def test_pending_input_after_a_reopen_and_read_only(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Another store object on the same data (and a read-only one) finds the same."""
        store = await thread_store_factory.open()
        try:
            threads = await _turn_threads(store)
            found = await store.threads_with_pending_input()
        finally:
            await store.aclose()
        again = await thread_store_factory.open()
        try:
            assert await again.threads_with_pending_input() == found
        finally:
            await again.aclose()
        read_only = self.read_only_factory(thread_store_factory)
        if read_only is None:
            pytest.skip("the store has no read-only open")
        reader = await read_only.open()
        try:
            assert await reader.threads_with_pending_input() == found
            assert threads["ended"] not in found
        finally:
            await reader.aclose()
