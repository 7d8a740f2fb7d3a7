"""Store checks: a store written before ``open_turns`` was stored is upgraded once, or read.

A store whose pending-input query reads a stored count of open turns (a column, an index
field) was once written without it. The kit cannot turn a store back into its older form
by itself, nor read its version (that takes the store's medium), so a store's test class
overrides the hooks of :class:`OpenTurnsUpgradeChecks`; the kit then checks what every
such store promises: the count follows every append; an older store opened read-only
answers the same, changing nothing; opened by a store that writes, it is upgraded once
and the count is right for every thread.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    InputAccepted,
    TurnComplete,
    TurnStarted,
)
from roder_api.testing._kit_support import make_metadata, user_item
from roder_api.testing._store_kit_base import StoreKitBase
from roder_api.threads import ThreadStore, ThreadStoreFactory

OPEN_TURN_DELTAS = 150
"""Events the open turn journals after its input was accepted (more than any fixed tail)."""


class OpenTurnsUpgradeChecks(StoreKitBase):
    """Checks of the stored open-turn count and of the upgrade that added it.

    Override :meth:`as_older_version`, :meth:`stored_version` and
    :meth:`stored_open_turns` (and :meth:`read_only_factory`); set
    :attr:`older_version` and :attr:`current_version`.
    """

    older_version: ClassVar[int] = 0
    """The store's version before it stored the open-turn count."""

    current_version: ClassVar[int] = 0
    """The store's version now (what an upgrade leaves)."""

    def as_older_version(self, factory: ThreadStoreFactory) -> None:
        """Turn the closed store into what :attr:`older_version` wrote (override this)."""
        raise NotImplementedError("override as_older_version to turn the store back")

    def stored_version(self, factory: ThreadStoreFactory) -> int:
        """Return the version the closed store's medium records (override this)."""
        raise NotImplementedError("override stored_version to read the store's version")

    def stored_open_turns(self, factory: ThreadStoreFactory) -> dict[str, int] | None:
        """Return ``thread id -> stored open-turn count``, None when nothing stores it."""
        raise NotImplementedError("override stored_open_turns to read the stored counts")

    def stored_state(self, factory: ThreadStoreFactory) -> object:
        """Return what a read-only open must leave as it was (default: version and counts).

        Override it to compare more (the store's files, its rows).
        """
        return self.stored_version(factory), self.stored_open_turns(factory)

    def older_metadata(self, stored: str | bytes) -> str:
        """Return a thread's stored metadata (JSON) as the older version wrote it.

        A helper for :meth:`as_older_version`: the same document less ``open_turns``.
        """
        data = json.loads(stored)
        data.pop("open_turns")
        return json.dumps(data, separators=(",", ":"))

    async def check_older_reader(self, reader: Any, threads: dict[str, str]) -> None:
        """Check more of a read-only store of the older version (default: nothing)."""

    async def store_open_turn_threads(self, factory: ThreadStoreFactory) -> dict[str, str]:
        """Store a thread with a long open turn and one whose turn ended; return their ids.

        The keys are ``pending`` (turn ``r1`` accepted, started and left open) and
        ``ended`` (turn ``a`` started and completed). Every store is closed on return.
        """
        store: ThreadStore = await factory.open()
        try:
            pending = (await store.create_thread(make_metadata())).thread_id
            await store.append_events(pending, [InputAccepted("r1", "go"), TurnStarted("r1")])
            for start in range(0, OPEN_TURN_DELTAS, 30):
                await store.append_events(
                    pending,
                    [
                        AssistantContentDelta("r1", "s", ContentPhase.FINAL_ANSWER, f"w{i}")
                        for i in range(start, start + 30)
                    ],
                )
            ended = (await store.create_thread(make_metadata())).thread_id
            await store.append_events(
                ended, [TurnStarted("a"), user_item("hi", "a"), TurnComplete("a")]
            )
        finally:
            await store.aclose()
        return {"pending": pending, "ended": ended}

    async def test_the_open_turn_count_follows_every_append(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """The stored count is what the journal says after each append; the query reads it."""
        threads = await self.store_open_turn_threads(thread_store_factory)
        counts = self.stored_open_turns(thread_store_factory)
        assert counts == {threads["pending"]: 1, threads["ended"]: 0}, counts
        assert self.stored_version(thread_store_factory) == self.current_version
        store: ThreadStore = await thread_store_factory.open()
        try:
            assert await store.threads_with_pending_input() == [threads["pending"]]
            await store.append_events(threads["pending"], [TurnComplete("r1")])
            assert await store.threads_with_pending_input() == []
            assert (await store.get_thread(threads["pending"])).open_turns == ()
        finally:
            await store.aclose()
        counts = self.stored_open_turns(thread_store_factory)
        assert counts == {threads["pending"]: 0, threads["ended"]: 0}, counts

    async def test_an_older_store_is_read_as_it_is_when_read_only(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Opened read-only, an older store finds the open turn and is left unchanged."""
        read_only = self.read_only_factory(thread_store_factory)
        if read_only is None:
            pytest.skip("this store has no read-only factory")
        threads = await self.store_open_turn_threads(thread_store_factory)
        self.as_older_version(thread_store_factory)
        assert self.stored_version(thread_store_factory) == self.older_version
        assert self.stored_open_turns(thread_store_factory) is None
        before = self.stored_state(thread_store_factory)
        reader: ThreadStore = await read_only.open()
        try:
            assert await reader.threads_with_pending_input() == [threads["pending"]]
            await self.check_older_reader(reader, threads)
        finally:
            await reader.aclose()
        assert self.stored_state(thread_store_factory) == before, "a read-only open wrote"

    async def test_an_older_store_is_upgraded_once_when_opened(
        self, thread_store_factory: ThreadStoreFactory
    ) -> None:
        """Opened by a store that writes, an older store gains the count of every thread."""
        threads = await self.store_open_turn_threads(thread_store_factory)
        self.as_older_version(thread_store_factory)
        store: ThreadStore = await thread_store_factory.open()
        try:
            assert await store.threads_with_pending_input() == [threads["pending"]]
            assert self.stored_version(thread_store_factory) == self.current_version
            counts = self.stored_open_turns(thread_store_factory)
            assert counts == {threads["pending"]: 1, threads["ended"]: 0}, counts
            assert (await store.get_thread(threads["pending"])).open_turns == ("r1",)
            assert (await store.get_thread(threads["ended"])).open_turns == ()
            await store.append_events(threads["ended"], [InputAccepted("b", "more")])
            pending = await store.threads_with_pending_input()
            assert pending == [threads["ended"], threads["pending"]], pending
        finally:
            await store.aclose()
