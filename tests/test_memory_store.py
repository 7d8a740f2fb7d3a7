"""``MemoryThreadStore``: what the kit does not cover — fault injection, shared data, leases.

The whole conformance kit runs against it in ``tests/test_store_conformance.py``.
"""

from __future__ import annotations

import pytest

from roder_api.errors import StoreError, ThreadBusyError
from roder_api.testing import MemoryThreadStore, MemoryThreadStoreFactory
from roder_api.testing.conformance import make_metadata, user_item

pytestmark = [pytest.mark.anyio, pytest.mark.core]


class FailingAppends(MemoryThreadStore):
    """Fails every append before it touches the data."""

    async def fault_point(self, operation: str, thread_id: str | None) -> None:
        if operation == "append_events":
            raise StoreError(f"injected fault on {thread_id}")


async def test_a_fault_point_failure_writes_nothing() -> None:
    factory = MemoryThreadStoreFactory(store_class=FailingAppends)
    store = await factory.open()
    tid = (await store.create_thread(make_metadata())).thread_id
    with pytest.raises(StoreError, match="injected fault"):
        await store.append_events(tid, [user_item("x")])
    assert await store.read_events(tid) == []
    plain = MemoryThreadStore(factory.data)
    assert (await plain.get_thread(tid)).last_sequence == 0
    await plain.append_events(tid, [user_item("y")])
    assert [e.sequence for e in await store.read_events(tid)] == [1]


async def test_opens_of_one_factory_share_threads_and_leases() -> None:
    factory = MemoryThreadStoreFactory()
    first, second = await factory.open(), await factory.open()
    tid = (await first.create_thread(make_metadata())).thread_id
    async with first.lease(tid, owner="one") as lease:
        assert lease.holder.owner == "one"
        with pytest.raises(ThreadBusyError) as info:
            async with second.lease(tid, owner="two"):
                raise AssertionError("a second holder got the lease")
        assert info.value.holder == lease.holder
    async with second.lease(tid, owner="two") as lease:
        assert lease.holder.owner == "two"
    other = MemoryThreadStore()  # other data: other leases
    async with first.lease(tid, owner="one"), other.lease(tid, owner="three"):
        pass


@pytest.mark.parametrize("bad", [-1, True, "1", 1.0])
async def test_expected_last_sequence_must_be_a_count(bad: object) -> None:
    store = MemoryThreadStore()
    tid = (await store.create_thread(make_metadata())).thread_id
    with pytest.raises(ValueError, match="expected_last_sequence"):
        await store.append_events(tid, [user_item("x")], expected_last_sequence=bad)  # type: ignore[arg-type]
    assert await store.read_events(tid) == []
