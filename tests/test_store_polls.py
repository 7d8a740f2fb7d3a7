"""One poller per store: ``wait_for_events``'s polls of many threads share worker calls.

A server keeps a session following each thread it answered lately; each follower polls
the store for other processes' appends. The kit's stores answer the polls made in one
pass of the event loop with one worker call (``CoalescedReads``), and the polls wake on a
shared grid so that they meet. Checked on a real JSONL store, with a second store object
on the same directory standing for another process (its appends wake nobody here: only
the poll finds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from roder_api.errors import StoppedError, StoreError, ThreadNotFoundError
from roder_api.events import ItemCompleted
from roder_api.storekit._polls import CoalescedReads
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def _open(path: Path) -> JsonlThreadStore:
    store = await JsonlThreadStoreFactory(base_path=path).open()
    assert isinstance(store, JsonlThreadStore)
    return store


async def _threads(store: JsonlThreadStore, count: int) -> list[str]:
    ids = [f"t{i:03d}" for i in range(count)]
    for thread_id in ids:
        await store.create_thread(ThreadMetadata(thread_id, 1, 1))
    return ids


async def test_the_polls_of_many_waiters_share_worker_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _open(tmp_path)
    try:
        ids = await _threads(store, 30)
        calls: list[int] = []
        read = store.last_sequences_sync

        def counted(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
            calls.append(len(thread_ids))
            return read(thread_ids)

        monkeypatch.setattr(store, "last_sequences_sync", counted)

        async def wait(thread_id: str, after_s: float) -> None:
            await anyio.sleep(after_s)
            await store.wait_for_events(thread_id, 0, 2.0)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as task_group:
                for index, thread_id in enumerate(ids):
                    # Started apart, as a server's sessions go idle: the grid brings their
                    # polls together.
                    task_group.start_soon(wait, thread_id, index * 0.007)
        polls = sum(calls)
        # Each waiter polls about twelve times in two seconds (pauses 0.02 s doubling to
        # 0.25); its first poll is its own, the others meet on the grid.
        assert polls >= 30 * 10, f"only {polls} polls"
        assert len(calls) * 3 < polls, f"{len(calls)} worker calls for {polls} polls"
    finally:
        await store.aclose()


async def test_another_processes_appends_wake_every_waiter_with_its_own_answer(
    tmp_path: Path,
) -> None:
    here = await _open(tmp_path)
    there = await _open(tmp_path)  # another process's store: its appends notify nobody here
    try:
        ids = await _threads(here, 12)
        gone = ids.pop()
        woken: dict[str, int] = {}
        missing: list[BaseException] = []

        async def wait(thread_id: str) -> None:
            woken[thread_id] = await here.wait_for_events(thread_id, 0, 30.0)

        async def wait_gone() -> None:
            try:
                await here.wait_for_events(gone, 0, 30.0)
            except ThreadNotFoundError as exc:
                missing.append(exc)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as task_group:
                for thread_id in ids:
                    task_group.start_soon(wait, thread_id)
                task_group.start_soon(wait_gone)
                await anyio.sleep(0.3)  # every waiter has polled and sleeps
                assert woken == {}
                for count, thread_id in enumerate(ids, start=1):
                    items = [ItemCompleted("turn", UserMessage(f"m{n}")) for n in range(count)]
                    await there.append_events(thread_id, items)
                await there.delete_thread(gone)
        assert woken == {thread_id: count for count, thread_id in enumerate(ids, start=1)}
        assert len(missing) == 1
    finally:
        await here.aclose()
        await there.aclose()


async def test_reads_made_at_once_are_one_call_each_with_its_own_answer() -> None:
    calls: list[list[str]] = []

    async def read_many(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
        calls.append(list(thread_ids))
        answers = {thread_id: len(thread_id) for thread_id in thread_ids}
        return {**answers, "bad": ThreadNotFoundError("bad")}

    reads = CoalescedReads(read_many)
    answers: dict[str, object] = {}

    async def ask(thread_id: str) -> None:
        try:
            answers[thread_id] = await reads.last_sequence(thread_id)
        except ThreadNotFoundError as exc:
            answers[thread_id] = exc

    with anyio.fail_after(10):
        async with anyio.create_task_group() as task_group:
            for thread_id in ("a", "bb", "bad"):
                task_group.start_soon(ask, thread_id)
    assert calls == [["a", "bad", "bb"]]  # one call for the three
    assert answers["a"] == 1 and answers["bb"] == 2
    assert isinstance(answers["bad"], ThreadNotFoundError)
    assert await reads.last_sequence("ccc") == 3  # the next pass: a call of its own
    assert calls[1:] == [["ccc"]]


async def test_a_leader_cancelled_while_reading_still_answers_the_others() -> None:
    release, reading = anyio.Event(), anyio.Event()
    leaders: list[str] = []

    async def read_many(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
        leaders.append(anyio.get_current_task().name or "")
        reading.set()
        await release.wait()
        return dict.fromkeys(thread_ids, 7)

    reads = CoalescedReads(read_many)
    scopes: dict[str, anyio.CancelScope] = {}
    answers: dict[str, int] = {}

    async def ask(name: str) -> None:
        with anyio.CancelScope() as scope:
            scopes[name] = scope
            answers[name] = await reads.last_sequence(name)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as task_group:
            for name in ("one", "two", "three"):
                task_group.start_soon(ask, name, name=name)
            await reading.wait()
            await anyio.sleep(0.05)  # a second read would have started by now
            assert len(leaders) == 1  # one read for the three
            scopes[leaders[0]].cancel()  # the read is under way: it finishes, shielded
            await anyio.sleep(0.1)
            release.set()
    others = {"one", "two", "three"} - set(leaders)
    assert {name: answers.get(name) for name in others} == dict.fromkeys(others, 7)


async def test_a_failed_read_fails_its_batch_and_the_next_read_tries_again() -> None:
    failures: list[Exception] = [OSError("disk gone")]

    async def read_many(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
        if failures:
            raise failures.pop()
        return dict.fromkeys(thread_ids, 3)

    reads = CoalescedReads(read_many)
    with pytest.raises(StoreError, match="disk gone") as raised:
        await reads.last_sequence("t")
    assert isinstance(raised.value.__cause__, OSError)
    assert await reads.last_sequence("t") == 3
    failures.append(StoppedError("the store is closed"))
    with pytest.raises(StoppedError):  # Roder's own errors as the read alone raised them
        await reads.last_sequence("t")
