"""roder_api.storekit.GroupCommit: concurrent commits share writes; outcomes reach each caller."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from roder_api.errors import StoppedError
from roder_api.storekit import GroupCommit

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_concurrent_submits_share_one_synced_write_each_batch(tmp_path: Path) -> None:
    path = tmp_path / "log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    batches: list[list[int]] = []

    def write(items: list[int]) -> Sequence[int | BaseException]:
        os.write(fd, b"".join(b"%d\n" % item for item in items))
        os.fsync(fd)
        batches.append(list(items))
        return [item * 10 for item in items]

    group: GroupCommit[int, int] = GroupCommit(write)
    results: dict[int, int] = {}

    async def one(item: int) -> None:
        results[item] = await group.submit(item)

    async with anyio.create_task_group() as tg:
        for item in range(200):
            tg.start_soon(one, item)
    os.close(fd)
    assert results == {item: item * 10 for item in range(200)}
    assert sorted(x for batch in batches for x in batch) == list(range(200))
    assert group.batches == len(batches) < 50  # far fewer syncs than commits
    assert sorted(int(line) for line in path.read_text().split()) == list(range(200))


async def test_a_lone_submit_goes_at_once_and_a_burst_after_it_waits_for_one_batch_at_most() -> (
    None
):
    batches: list[list[int]] = []

    def write(items: list[int]) -> Sequence[int | BaseException]:
        batches.append(sorted(items))
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write)
    for item in range(5):  # awaited one at a time: a batch each
        assert await group.submit(item) == item
    assert batches == [[0], [1], [2], [3], [4]]

    async def burst(start: int) -> None:
        async with anyio.create_task_group() as tg:
            for item in range(start, start + 20):
                tg.start_soon(group.submit, item)

    del batches[:]
    await burst(100)
    # After lone submits the first of a burst went alone; the rest shared the next write
    # (trio starts the tasks in an order of its own).
    assert [len(batch) for batch in batches] == [1, 19]
    assert sorted(batches[0] + batches[1]) == list(range(100, 120))
    del batches[:]
    await burst(200)
    assert batches == [list(range(200, 220))]  # after a batch of many: one batch, as before


async def test_an_item_refused_by_the_write_fails_only_its_caller() -> None:
    def write(items: list[int]) -> Sequence[int | BaseException]:
        return [ValueError(f"odd {i}") if i % 2 else i for i in items]

    group: GroupCommit[int, int] = GroupCommit(write)
    outcomes: dict[int, object] = {}

    async def one(item: int) -> None:
        try:
            outcomes[item] = await group.submit(item)
        except ValueError as exc:
            outcomes[item] = str(exc)

    async with anyio.create_task_group() as tg:
        for item in range(10):
            tg.start_soon(one, item)
    assert outcomes == {i: (f"odd {i}" if i % 2 else i) for i in range(10)}


async def test_a_write_that_raises_fails_every_caller_of_its_batch_and_no_other() -> None:
    calls = 0

    def write(items: list[str]) -> Sequence[str | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("disk gone")
        return [item.upper() for item in items]

    group: GroupCommit[str, str] = GroupCommit(write)
    with pytest.raises(OSError, match="disk gone"):
        await group.submit("a")
    assert await group.submit("b") == "B"  # the primitive is usable after a failed batch


async def test_a_write_returning_the_wrong_number_of_outcomes_is_an_error() -> None:
    group: GroupCommit[int, int] = GroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="returned 0 outcomes for 1 items"):
        await group.submit(1)


async def test_a_cancelled_caller_does_not_stop_the_batch_it_is_in() -> None:
    release = threading.Event()
    written: list[int] = []

    def write(items: list[int]) -> Sequence[int | BaseException]:
        release.wait(10)
        written.extend(items)
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write)
    got: list[int] = []

    async def one(item: int) -> None:
        got.append(await group.submit(item))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 1)  # the leader: its write blocks until released
        await anyio.sleep(0.05)
        tg.start_soon(one, 2)
        follower = anyio.CancelScope()

        async def cancelled_follower() -> None:
            with follower:
                await group.submit(3)

        tg.start_soon(cancelled_follower)
        tg.start_soon(one, 4)
        await anyio.sleep(0.05)
        follower.cancel()
        await anyio.sleep(0.01)
        release.set()
    assert sorted(got) == [1, 2, 4]
    assert sorted(written) == [1, 2, 3, 4]  # the cancelled caller's item was still written


async def test_writes_run_off_the_event_loop_one_batch_at_a_time_on_the_kits_workers() -> None:
    loop_thread = threading.get_ident()
    seen: list[threading.Thread] = []
    running = 0
    overlapped = False

    def write(items: list[int]) -> Sequence[int | BaseException]:
        nonlocal running, overlapped
        running += 1
        overlapped = overlapped or running > 1
        seen.append(threading.current_thread())
        time.sleep(0.001)
        running -= 1
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write)
    for _ in range(3):
        async with anyio.create_task_group() as tg:
            for item in range(20):
                tg.start_soon(group.submit, item)
    assert seen and not overlapped
    assert loop_thread not in {t.ident for t in seen}
    # The one thread mechanism under the store path: the kit's worker pool, no thread of
    # the group commit's own.
    assert {t.name for t in seen} == {"roder-store-worker"}


async def test_close_waits_for_the_batch_handed_over_then_refuses_more() -> None:
    written: list[int] = []
    entered = threading.Event()
    release = threading.Event()

    def write(items: list[int]) -> Sequence[int | BaseException]:
        entered.set()
        assert release.wait(10)
        written.extend(items)
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write)
    async with anyio.create_task_group() as tg:
        tg.start_soon(group.submit, 1)
        await anyio.to_thread.run_sync(entered.wait, 10)
        closing = threading.Thread(target=group.close)
        closing.start()
        await anyio.sleep(0.2)
        assert closing.is_alive()  # waits for the batch being written
        release.set()
        await anyio.to_thread.run_sync(closing.join, 10)
        assert not closing.is_alive()
    with pytest.raises(StoppedError, match="closed"):
        await group.submit(2)
    assert written == [1]


def test_the_ignored_limiter_is_still_accepted_and_says_it_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="ignored"):
        GroupCommit(list, limiter=anyio.CapacityLimiter(1))  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_usable_from_a_later_event_loop_even_if_the_first_ended_mid_batch(backend: str) -> None:
    # One object, two event loops one after the other (two anyio.run calls): the first ends
    # while its batch is still being written; the second loop's commits must not wait for
    # a wake-up that the dead loop can no longer deliver.
    release = threading.Event()
    written: list[int] = []

    def write(items: list[int]) -> Sequence[int | BaseException]:
        if 1 in items:
            release.wait(10)
        written.extend(items)
        return list(items)

    group: GroupCommit[int, int] = GroupCommit(write)

    async def first() -> None:
        with anyio.move_on_after(0.1):
            await group.submit(1)

    async def second() -> list[int]:
        with anyio.fail_after(5):
            return [await group.submit(2), await group.submit(3)]

    anyio.run(first, backend=backend)
    release.set()
    time.sleep(0.05)  # the committer finishes batch 1 and finds its loop closed
    assert anyio.run(second, backend=backend) == [2, 3]
    assert written == [1, 2, 3]


async def test_after_runs_once_the_callers_are_woken_and_close_waits_for_it(
    tmp_path: Path,
) -> None:
    # ``after`` (a store's index update, say) is off the callers' path: a caller returns
    # while it still runs, and close() returns only once it is done.
    returned = threading.Event()
    release = threading.Event()
    seen: list[str] = []

    def after() -> None:
        seen.append("after: caller had returned" if returned.wait(10) else "after: too early")
        release.wait(10)
        seen.append("after: done")

    group: GroupCommit[int, int] = GroupCommit(lambda items: items, after=after)
    assert await group.submit(7) == 7
    returned.set()
    closing = threading.Thread(target=group.close, args=(10.0,))
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # close waits for ``after``
    release.set()
    closing.join(10)
    assert not closing.is_alive()
    assert seen == ["after: caller had returned", "after: done"]


async def test_an_after_that_raises_is_logged_and_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def after() -> None:
        raise OSError("index gone")

    group: GroupCommit[int, int] = GroupCommit(lambda items: [i * 2 for i in items], after=after)
    assert [await group.submit(i) for i in range(3)] == [0, 2, 4]
    await anyio.to_thread.run_sync(group.close)
    assert "index gone" in caplog.text
