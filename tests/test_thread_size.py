"""``ThreadStore.thread_size_bytes``: exact for JSONL, estimated for stores that cannot tell."""

from __future__ import annotations

import pytest

from roder_api.errors import ThreadNotFoundError
from roder_api.threads import ThreadStore
from roder_jsonl_thread_store import JsonlThreadStore
from roder_runtime import Runtime
from roder_runtime.cli._threads_manage import thread_size

pytestmark = pytest.mark.anyio


class SizelessStore(JsonlThreadStore):
    """A store that keeps the base class's answer: it cannot tell a thread's size."""

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        return await ThreadStore.thread_size_bytes(self, thread_id)


async def test_jsonl_reports_its_journal_size_and_others_are_estimated(runtime: Runtime) -> None:
    thread_id = (await runtime.create_thread(title="sized")).thread_id
    for text in ("one", "two", "three"):
        await runtime.run_turn(thread_id, text)
    store = await runtime.store()
    assert isinstance(store, JsonlThreadStore)
    journal = store.journal_path(thread_id)
    assert await store.thread_size_bytes(thread_id) == journal.stat().st_size
    assert await thread_size(store, thread_id) == (journal.stat().st_size, True)

    sizeless = SizelessStore(store.base_path)
    assert await sizeless.thread_size_bytes(thread_id) is None
    estimate, exact = await thread_size(sizeless, thread_id)
    assert not exact
    # The events serialised one per line: not the store's framing, but the same magnitude.
    assert journal.stat().st_size / 2 < estimate < journal.stat().st_size * 2

    for probe in (store, sizeless):
        with pytest.raises(ThreadNotFoundError):
            await probe.thread_size_bytes("missing")
