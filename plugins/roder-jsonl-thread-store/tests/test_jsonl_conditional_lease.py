"""Conditional appends and thread leases of the JSONL store, across real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from jsonl_helpers import msg

from roder_api.errors import (
    SequenceConflictError,
    StoreError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from roder_api.storekit import FileLeases
from roder_api.threads import ThreadMetadata
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_jsonl_thread_store._format import parse_line

pytestmark = pytest.mark.anyio

RACER = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.errors import SequenceConflictError
    from roder_api.events import ItemCompleted
    from roder_api.transcript import UserMessage
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    base, name, rounds, durability = sys.argv[1:5]

    async def main() -> None:
        store = await JsonlThreadStoreFactory(base, durability=durability).open()
        print("ready", flush=True)
        sys.stdin.readline()  # start together
        landed = conflicts = 0
        for i in range(int(rounds)):
            last = (await store.get_thread("race")).last_sequence
            item = ItemCompleted("turn", UserMessage(f"{name} {i} after {last}"))
            try:
                await store.append_events("race", [item], expected_last_sequence=last)
            except SequenceConflictError as exc:
                assert exc.expected == last and exc.actual > last, (exc.expected, exc.actual)
                conflicts += 1
            else:
                landed += 1
        await store.aclose()
        print(landed, conflicts, flush=True)

    anyio.run(main)
    """
)


async def test_conditional_append_writes_only_when_the_journal_is_where_expected(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    await store.create_thread(ThreadMetadata("t", 1000, 1000))
    first = await store.append_events("t", [msg(0)], expected_last_sequence=0)
    assert [e.sequence for e in first] == [1]
    size = store.journal_path("t").stat().st_size
    with pytest.raises(SequenceConflictError) as caught:
        await store.append_events("t", [msg(1)], expected_last_sequence=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert "someone appended meanwhile" in str(caught.value)
    assert store.journal_path("t").stat().st_size == size  # nothing written
    with pytest.raises(SequenceConflictError):
        await store.append_events("t", [], expected_last_sequence=5)
    assert await store.append_events("t", [], expected_last_sequence=1) == []
    second = await store.append_events("t", [msg(1), msg(2)], expected_last_sequence=1)
    assert [e.sequence for e in second] == [2, 3]
    with pytest.raises(ThreadNotFoundError):
        await store.append_events("nope", [msg(0)], expected_last_sequence=0)
    await store.aclose()


def race(base: Path, rounds: int, durability: str) -> tuple[int, int]:
    """Run two racing children; return how many appends landed and how many conflicted."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(base), name, str(rounds), durability],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    landed = conflicts = 0
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0, out
        done, refused = map(int, out.split())
        assert done + refused == rounds
        landed, conflicts = landed + done, conflicts + refused
    return landed, conflicts


@pytest.mark.parametrize("durability", ["group", "fsync"])
async def test_conditional_appends_in_one_group_commit_see_each_other(
    factory: JsonlThreadStoreFactory, durability: str
) -> None:
    store = await JsonlThreadStoreFactory(factory.base_path, durability=durability).open()
    await store.create_thread(ThreadMetadata("g", 1000, 1000))
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await store.append_events("g", [msg(i)], expected_last_sequence=0)
            outcomes.append("landed")
        except SequenceConflictError:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    assert sorted(outcomes) == ["conflict"] * 19 + ["landed"]
    assert (await store.get_thread("g")).last_sequence == 1
    await store.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("durability", ["none", "group"])
async def test_conditional_appends_racing_from_two_processes_land_exactly_once(
    tmp_path: Path, durability: str
) -> None:
    base = tmp_path / "store"
    store = await JsonlThreadStoreFactory(base).open()
    await store.create_thread(ThreadMetadata("race", 1000, 1000))
    await store.aclose()
    rounds = 300
    landed, conflicts = race(base, rounds, durability)
    assert conflicts > 0  # they really raced
    lines = (base / "threads" / "race.jsonl").read_bytes().split(b"\n")
    records = [parse_line(line) for line in lines[:-1]]
    events = [r for r in records if r["k"] == "events"]
    assert [r["seq"] for r in events] == list(range(1, landed + 1))
    for record in events:
        # Each landed append saw exactly the journal it was written after.
        text = record["events"][0]["item"]["text"]
        assert text.endswith(f" after {record['seq'] - 1}"), text


LEASER = textwrap.dedent(
    """
    import sys, time
    import anyio
    from roder_jsonl_thread_store import JsonlThreadStoreFactory

    async def main() -> None:
        store = await JsonlThreadStoreFactory(sys.argv[1]).open()
        async with store.lease("t", owner="child session"):
            print("held", flush=True)
            time.sleep(3600)

    anyio.run(main)
    """
)


def spawn_leaser(base: Path) -> subprocess.Popen[str]:
    """Start a child process that takes thread ``t``'s lease and holds it."""
    return subprocess.Popen(
        [sys.executable, "-c", LEASER, str(base)], stdout=subprocess.PIPE, text=True
    )


async def test_a_lease_held_by_a_process_refuses_others_until_it_is_killed(
    factory: JsonlThreadStoreFactory,
) -> None:
    store = await factory.open()
    await store.create_thread(ThreadMetadata("t", 1000, 1000))
    child = spawn_leaser(factory.base_path)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(ThreadBusyError) as caught:
            async with store.lease("t", owner="parent"):
                pytest.fail("the lease was granted twice")
        holder = caught.value.holder
        assert holder is not None
        assert (holder.owner, holder.pid) == ("child session", child.pid)
        assert f"pid {child.pid}" in str(caught.value) and "child session" in str(caught.value)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        async with store.lease("t", owner="parent") as lease:
            assert lease.holder.owner == "parent" and lease.holder.pid == os.getpid()
            with pytest.raises(ThreadBusyError) as again:
                async with store.lease("t", owner="second in this process"):
                    pytest.fail("two leases in one process")
            assert again.value.holder == lease.holder
        async with store.lease("t", owner="after release"):
            pass
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    await store.aclose()


async def test_two_store_objects_exclude_each_other_and_other_threads_are_free(
    factory: JsonlThreadStoreFactory,
) -> None:
    one, two = await factory.open(), await factory.open()
    async with one.lease("a", owner="one"):
        with pytest.raises(ThreadBusyError):
            async with two.lease("a", owner="two"):
                pass
        async with two.lease("b", owner="two"):
            pass
    async with two.lease("a", owner="two"):
        pass
    await one.aclose()
    await two.aclose()


async def test_a_lease_directory_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the lease directory should be")
    leases = FileLeases(blocker / "leases")
    with pytest.raises(StoreError) as caught:
        async with leases.lease("t", owner="me"):
            pass
    assert "cannot take the lease of thread 't'" in str(caught.value)
    assert "read-only store" in str(caught.value)
