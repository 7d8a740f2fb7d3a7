"""The value rule of the conformance kit, run against every store of this repository."""

from __future__ import annotations

import pytest

from roder_api.testing._conformance_values import ThreadStoreValueConformance
from roder_api.threads import ThreadStoreFactory

from .test_store_conformance import thread_store_factory as store_factory  # noqa: F401


class TestStoreValues(ThreadStoreValueConformance):
    """Every store keeps what stdlib ``json`` keeps, and refuses the rest with its path."""

    pytestmark = [pytest.mark.anyio]

    @pytest.fixture
    def thread_store_factory(self, store_factory: ThreadStoreFactory) -> ThreadStoreFactory:  # noqa: F811
        """Use the parametrized factory of every backend."""
        return store_factory

    @pytest.fixture
    async def thread_store(self, thread_store_factory: ThreadStoreFactory):  # type: ignore[no-untyped-def]
        store = await thread_store_factory.open()
        try:
            yield store
        finally:
            await store.aclose()
