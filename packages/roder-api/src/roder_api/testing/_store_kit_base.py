"""The base of the store kit's check groups: its fixtures and tuning knobs."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from roder_api.testing._kit_support import (
    backends,
)
from roder_api.threads import (
    ThreadStoreFactory,
)


class StoreKitBase:
    """The fixtures and class attributes every group of store checks uses.

    The factory fixture must return a :class:`ThreadStoreFactory` whose stores start empty
    for each test and whose ``open()`` may be called several times (a reopen, or two store
    objects on the same data at once). Class attributes tune the load of the concurrency
    checks.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    concurrent_tasks: ClassVar[int] = 16
    """How many tasks append at once in the concurrency checks."""

    batches_per_task: ClassVar[int] = 8
    """How many batches each of those tasks appends."""

    large_event_bytes: ClassVar[int] = 1 << 20
    """The size of the large event the store must keep exactly (1 MiB)."""

    cross_process_appends: ClassVar[int] = 40
    """How many conditional appends each of the two child processes makes."""

    lease_release_timeout_s: ClassVar[float] = 15.0
    """How long a SIGKILLed holder's lease may take to be free again."""

    def child_process_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory | None:
        """Return a picklable factory that opens the same store in another process.

        The cross-process checks pickle it into child processes (which get this process's
        import path). The default is ``factory`` itself when it pickles, else None: the
        cross-process checks are then skipped (a store that lives in one process).
        """
        try:
            pickle.dumps(factory)
        except Exception:  # noqa: BLE001 - whatever pickling raises means "cannot share"
            return None
        return factory

    def read_only_factory(self, factory: ThreadStoreFactory) -> ThreadStoreFactory | None:
        """Return a factory that opens the same store read-only, or None (the default).

        When given, the kit checks that such a store reads everything and that every
        write raises ``StoreError``.
        """
        return None

    @pytest.fixture(params=backends())
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Run every check under asyncio and trio."""
        return str(request.param)

    @pytest.fixture
    def thread_store_factory(self) -> ThreadStoreFactory:
        """Return the factory of the store under test (override this fixture)."""
        raise NotImplementedError(
            "override the `thread_store_factory` fixture to return your store's factory"
        )

    @pytest.fixture
    async def thread_store(self, thread_store_factory: ThreadStoreFactory) -> AsyncIterator[Any]:
        """Return an open store from the factory, closed after the test."""
        store = await thread_store_factory.open()
        try:
            yield store
        finally:
            await store.aclose()
