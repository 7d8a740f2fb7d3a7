"""A thread's metadata (what ``get_thread`` and every session's poll read) comes from what
the store knows of the journal while one ``stat`` finds the file unchanged, without opening
it; whatever another process did to the journal since (an append, a delete, the thread made
again in a new file) is read from the file."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api.errors import ThreadNotFoundError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory, _reader
from roder_jsonl_thread_store._journal import TAIL_LINES

pytestmark = [pytest.mark.anyio, pytest.mark.core]

OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import ItemCompleted
    from roder_api.threads import ThreadMetadata
    from roder_api.transcript import UserMessage
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    base, action, thread_id = sys.argv[1:4]

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base).open()
        if action == "append":
            await store.append_events(thread_id, [ItemCompleted("turn", UserMessage("other"))])
        elif action == "delete":
            await store.delete_thread(thread_id)
        elif action == "recreate":  # the same journal's size, another file and content
            await store.delete_thread(thread_id)
            await store.create_thread(ThreadMetadata(thread_id, 2000, 2000, title="b"))
            await store.append_events(thread_id, [ItemCompleted("turn", UserMessage("m 0"))])
        await store.aclose()

    anyio.run(main)
    """
)


def other_process(base: Path, action: str, thread_id: str) -> None:
    """Do ``action`` to the thread from another process, through a store of its own."""
    subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(base), action, thread_id],
        check=True,
        timeout=60,
    )


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the files the reader opens (its module's ``open``)."""
    seen: list[str] = []
    real: Callable[..., Any] = open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(_reader, "open", counting_open, raising=False)
    return seen


@pytest.fixture
def anyio_backend() -> str:
    # Processes are the subject here; one event loop is enough.
    return "asyncio"


async def _store_with_thread(factory: JsonlThreadStoreFactory) -> JsonlThreadStore:
    store = await factory.open()
    await store.create_thread(ThreadMetadata("t", 1000, 1000, title="a"))
    await store.append_events("t", [ItemCompleted("turn", UserMessage("m 0"))])
    return store


async def test_an_unchanged_journal_is_not_opened_to_read_its_metadata(
    factory: JsonlThreadStoreFactory, opens: list[str]
) -> None:
    store = await _store_with_thread(factory)
    try:
        opens.clear()
        for _ in range(3):
            assert (await store.get_thread("t")).last_sequence == 1
            assert store.get_sync("t").last_sequence == 1
        assert opens == []
        await store.append_events("t", [ItemCompleted("turn", UserMessage("m 1"))])
        assert (await store.get_thread("t")).last_sequence == 2  # its own append: known
        assert opens == []
    finally:
        await store.aclose()


async def test_a_read_from_the_last_lines_written_needs_no_search(
    factory: JsonlThreadStoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading from a sequence in the last events lines this store wrote (what a session
    reads back before each turn: its last turn) starts at that line: no binary search."""
    store = await factory.open()
    try:
        await store.create_thread(ThreadMetadata("t", 1000, 1000))
        text = "x" * 500
        for i in range(100):  # ~50 KB: a search would read several windows
            await store.append_events("t", [ItemCompleted("turn", UserMessage(f"{i} {text}"))])
        batch = [ItemCompleted("turn", UserMessage(f"last {n}")) for n in range(3)]
        await store.append_events("t", batch)  # sequences 101, 102, 103
        searched: list[int] = []
        real = _reader.loads_json

        def counting(raw: Any) -> Any:
            searched.append(1)
            return real(raw)

        monkeypatch.setattr(_reader, "loads_json", counting)
        got = await store.read_events("t", after=101)
        assert [entry.sequence for entry in got] == [102, 103]
        assert [entry.event for entry in got] == batch[1:]
        assert [e.sequence for e in await store.read_events("t", after=100)] == [101, 102, 103]
        back = 100 - TAIL_LINES + 2  # in the oldest line remembered
        got = await store.read_events("t", after=back - 1, limit=2)
        assert [entry.sequence for entry in got] == [back, back + 1]
        assert searched == []
        assert [e.sequence for e in await store.read_events("t", after=50, limit=2)] == [51, 52]
        assert searched, "a sequence further back is searched for"
    finally:
        await store.aclose()


async def test_what_another_process_did_to_the_journal_is_read_from_the_file(
    factory: JsonlThreadStoreFactory, opens: list[str]
) -> None:
    base = Path(factory.base_path)
    store = await _store_with_thread(factory)
    try:
        assert (await store.get_thread("t")).title == "a"

        other_process(base, "append", "t")
        opens.clear()
        assert (await store.get_thread("t")).last_sequence == 2
        assert opens, "the journal grew: its state is read from the file"

        # A session's poll (``wait_for_events``, which reads the metadata) learns of
        # another process's append while it waits.
        polled: list[int] = []

        async def poll() -> None:
            polled.append(await store.wait_for_events("t", 2, 30.0))

        started = anyio.current_time()
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(poll)
            await anyio.sleep(0.2)  # the poll has read the unchanged journal by now
            await anyio.to_thread.run_sync(other_process, base, "append", "t")
        assert polled == [3]
        assert anyio.current_time() - started < 20  # woken by the poll, not the timeout

        # Deleted and made again elsewhere with a journal of the same size: another inode.
        before = store.journal_path("t").stat()
        other_process(base, "recreate", "t")
        after = store.journal_path("t").stat()
        assert after.st_ino != before.st_ino
        got = await store.get_thread("t")
        assert (got.title, got.created_at_ms, got.last_sequence) == ("b", 2000, 1)

        other_process(base, "delete", "t")
        with pytest.raises(ThreadNotFoundError):
            await store.get_thread("t")
        with pytest.raises(ThreadNotFoundError):  # a session's poll learns it the same way
            await store.wait_for_events("t", 0, 0.05)
    finally:
        await store.aclose()
