"""``roder threads fork`` copies with ``import_events``, the conditional write that keeps times:
the copy lands only on the fork's empty journal, and a fork that loses that race deletes
nothing anyone else wrote."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from roder_api.errors import SequenceConflictError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_runtime import Runtime
from roder_runtime.cli._common import CommandError
from roder_runtime.cli._threads_manage import fork_thread

pytestmark = pytest.mark.anyio


async def source_thread(runtime: Runtime) -> str:
    thread_id = (await runtime.create_thread(title="origin")).thread_id
    for text in ("one", "two", "three"):
        await runtime.persist_turn_item(thread_id, f"turn-{text}", UserMessage(text))
    return thread_id


async def test_the_fork_keeps_sequences_and_times_and_reads_only_a_final_prefix(
    runtime: Runtime,
) -> None:
    source = await source_thread(runtime)
    store = await runtime.store()
    journal = await store.read_events(source)
    fork, copied = await fork_thread(runtime, source, at=2)
    # Appends after the fork point do not reach the fork: the prefix it read was final.
    await runtime.persist_turn_item(source, "turn-four", UserMessage("four"))
    assert copied == 2 and await store.read_events(fork.thread_id) == journal[:2]
    assert fork.last_sequence == 2 and fork.extra["forked_from"] == {
        "thread_id": source,
        "sequence": 2,
    }
    assert await store.read_events(source) == [*journal, *(await store.read_events(source))[3:]]


async def test_a_fork_whose_new_thread_was_written_to_leaves_that_write_alone(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = await source_thread(runtime)
    store = await runtime.store()
    journal = await store.read_events(source)
    create = runtime.create_thread
    intruder: list[str] = []

    async def create_then_someone_appends(
        thread_id: str | None = None,
        *,
        title: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ThreadMetadata:
        made = await create(thread_id, title=title, extra=extra)
        # Another writer appends to the new thread before the copy lands.
        await store.append_events(made.thread_id, [ItemCompleted("other", UserMessage("mine"))])
        intruder.append(made.thread_id)
        return made

    monkeypatch.setattr(runtime, "create_thread", create_then_someone_appends)
    with pytest.raises(CommandError, match="written to during the fork") as caught:
        await fork_thread(runtime, source)
    assert isinstance(caught.value.__cause__, SequenceConflictError)
    [fork_id] = intruder
    assert fork_id in str(caught.value)
    # The copy wrote nothing; the other writer's acknowledged event is still there.
    [kept] = await store.read_events(fork_id)
    assert kept.sequence == 1 and kept.event == ItemCompleted("other", UserMessage("mine"))
    assert await store.read_events(source) == journal


async def test_a_fork_that_fails_otherwise_leaves_no_half_made_thread(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = await source_thread(runtime)
    store = await runtime.store()
    before = {m.thread_id for m in (await store.list_threads(limit=100)).threads}

    async def failing_import(thread_id: str, entries: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(store, "import_events", failing_import)
    with pytest.raises(OSError, match="disk full"):
        await fork_thread(runtime, source)
    assert {m.thread_id for m in (await store.list_threads(limit=100)).threads} == before
