"""One poller per store: ``wait_for_events``'s polls of many threads share worker calls.

A server keeps a session following each thread it answered lately; each follower polls
the store for other processes' appends. The kit's stores answer the reads made in one
pass of the event loop with one worker call (``CoalescedReads``: a wait's first read), and
after it keep every waiter in one schedule (the poll grid): one leader reads every thread
due with one call and wakes only the waiters whose thread moved on; the lead passes on
when its own wait ends. Checked on a real JSONL store, with a second store object on the
same directory standing for another process (its appends wake nobody here: only the poll
finds them).
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


def _item(text: str) -> ItemCompleted:
    return ItemCompleted("turn", UserMessage(text))


async def test_waiters_are_polled_together_not_each_by_its_own_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _open(tmp_path)
    try:
        ids = await _threads(store, 30)
        polled: list[int] = []
        lone: list[str] = []
        read_many, read_one = store.last_sequences_sync, store.read_last_sequence

        def counted_many(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
            polled.append(len(thread_ids))
            return read_many(thread_ids)

        async def counted_one(thread_id: str) -> int:
            lone.append(thread_id)
            return await read_one(thread_id)

        monkeypatch.setattr(store, "last_sequences_sync", counted_many)
        monkeypatch.setattr(store, "read_last_sequence", counted_one)

        async def wait(thread_id: str, after_s: float) -> None:
            await anyio.sleep(after_s)
            assert await store.wait_for_events(thread_id, 0, 2.0) == 0

        with anyio.fail_after(30):
            async with anyio.create_task_group() as task_group:
                for index, thread_id in enumerate(ids):
                    task_group.start_soon(wait, thread_id, index * 0.007)
        # Each waiter's thread is still polled about twelve times in its two seconds (pauses
        # 0.02 s doubling to 0.25) ...
        assert sum(polled) >= 30 * 10, f"only {sum(polled)} polls"
        assert len(polled) * 3 < sum(polled), f"{len(polled)} worker calls for {sum(polled)}"
        # ... but a waiter reads on its own only at its start and its deadline: its polls
        # are the grid's (each used to wake its task and read, a dozen times each).
        assert len(lone) <= 2 * 30, f"{len(lone)} reads of one thread for 30 waits"
    finally:
        await store.aclose()


async def test_the_lead_passes_on_when_the_leaders_wait_ends(tmp_path: Path) -> None:
    here = await _open(tmp_path)
    there = await _open(tmp_path)  # another process: only a poll finds its appends
    try:
        first, second, third = await _threads(here, 3)
        woken: dict[str, float] = {}
        cancelled = anyio.CancelScope()

        async def wait(thread_id: str, scope: anyio.CancelScope | None = None) -> None:
            with scope or anyio.CancelScope():
                await here.wait_for_events(thread_id, 0, 30.0)
                woken[thread_id] = anyio.current_time()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(wait, first)  # the first waiter leads
                await anyio.sleep(0.05)
                task_group.start_soon(wait, second, cancelled)
                task_group.start_soon(wait, third)
                await anyio.sleep(0.3)
                await here.append_events(first, [_item("here")])  # wakes the leader at once
                await anyio.sleep(0.05)
                assert set(woken) == {first}
                cancelled.cancel()  # the next leader, if it led, goes too
                await anyio.sleep(0.05)
                await there.append_events(third, [_item("there")])
                appended = anyio.current_time()
        assert set(woken) == {first, third}
        assert woken[third] - appended < 1.0  # found by a poll (pauses up to 0.25 s)
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_new_waiter_is_polled_soon_though_the_leader_polls_slowly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = await _open(tmp_path)
    there = await _open(tmp_path)
    try:
        monkeypatch.setattr(here, "wait_poll_s", (0.02, 8.0))  # pauses grow to seconds
        slow, fresh = await _threads(here, 2)
        found: list[float] = []
        woken = anyio.Event()

        async def wait_fresh() -> None:
            await here.wait_for_events(fresh, 0, 30.0)
            found.append(anyio.current_time())
            woken.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(here.wait_for_events, slow, 0, 30.0)  # leads
                await anyio.sleep(3.0)  # its pause is past a second now
                task_group.start_soon(wait_fresh)
                await anyio.sleep(0.01)
                await there.append_events(fresh, [_item("there")])
                appended = anyio.current_time()
                await woken.wait()
                await there.append_events(slow, [_item("there")])  # ends the leader's wait
        # The newcomer's first pauses (0.02, 0.04, ...) are kept: the leader was woken to
        # poll for it, not left asleep until its own next poll, seconds away.
        assert found[0] - appended < 0.5
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_wait_times_out_with_the_last_sequence(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    try:
        (thread_id,) = await _threads(store, 1)
        await store.append_events(thread_id, [_item("one")])
        with anyio.fail_after(10):
            started = anyio.current_time()
            assert await store.wait_for_events(thread_id, 1, 0.3) == 1
            assert anyio.current_time() - started >= 0.29
            assert await store.wait_for_events(thread_id, 0, 5.0) == 1  # past it: at once
    finally:
        await store.aclose()


async def test_a_failed_poll_fails_the_waits_it_was_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _open(tmp_path)
    try:
        ids = await _threads(store, 3)
        read_many = store.last_sequences_sync
        broken: list[bool] = []

        def failing(thread_ids: Sequence[str]) -> dict[str, int | Exception]:
            if broken:
                raise OSError("disk gone")
            return read_many(thread_ids)

        monkeypatch.setattr(store, "last_sequences_sync", failing)
        raised: list[BaseException] = []

        async def wait(thread_id: str) -> None:
            try:
                await store.wait_for_events(thread_id, 0, 30.0)
            except StoreError as exc:
                raised.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as task_group:
                for thread_id in ids:
                    task_group.start_soon(wait, thread_id)
                await anyio.sleep(0.1)  # every first read went through
                broken.append(True)
        assert len(raised) == 3
        assert all("disk gone" in str(exc) for exc in raised)
        assert all(isinstance(exc.__cause__, OSError) for exc in raised)
        broken.clear()
        assert await store.wait_for_events(ids[0], -1, 1.0) == 0  # and it works again
    finally:
        await store.aclose()
