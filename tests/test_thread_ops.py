"""The domain operations through the public API (``roder_runtime.threads`` and the Runtime):
fork, export, prune, delete, migrate and check, on JSONL, SQLite and the real PostgreSQL,
each bounded by the runtime's store deadline, and deletes refused while a session holds
the thread."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.codec import loads
from roder_api.errors import StoreError, ThreadBusyError, ThreadNotFoundError
from roder_api.testing import MemoryThreadStore, MemoryThreadStoreFactory, ScriptedEngine
from roder_api.threads import ThreadMetadata, ThreadStoreFactory
from roder_api.transcript import AssistantMessage, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, threads
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from .postgres_support import STORE_KINDS, store_factory_of

pytestmark = pytest.mark.anyio


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadStoreFactory]:
    """Return a factory of each real store kind (PostgreSQL in a throwaway schema)."""
    with store_factory_of(request.param, tmp_path) as factory:
        yield factory


def runtime_on(factory: ThreadStoreFactory, config: RuntimeConfig | None = None) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory)
    return Runtime(builder.build(), config or RuntimeConfig(), name="ops-test")


@pytest.fixture
async def rt(store_factory: ThreadStoreFactory) -> AsyncIterator[Runtime]:
    async with runtime_on(store_factory) as runtime:
        yield runtime


async def a_thread(runtime: Runtime, *texts: str, title: str | None = "origin") -> str:
    thread_id = (await runtime.create_thread(title=title)).thread_id
    for n, text in enumerate(texts):
        await runtime.persist_turn_items(
            thread_id, f"turn-{n}", [UserMessage(text), AssistantMessage(f"re: {text}")]
        )
    return thread_id


async def test_fork_copies_a_final_prefix_verbatim(rt: Runtime) -> None:
    source = await a_thread(rt, "one", "two", "three")
    _, journal = await threads.read_journal(rt, source)
    fork = await threads.fork_thread(rt, source, at=4)
    await rt.persist_turn_item(source, "turn-9", UserMessage("later"))
    metadata, copied = await threads.read_journal(rt, fork.thread.thread_id)
    assert fork.events_copied == 4 and copied == journal[:4]  # same sequences and times
    assert metadata == fork.thread and metadata.title == "origin (fork)"
    assert metadata.extra["forked_from"] == {"thread_id": source, "sequence": 4}
    with pytest.raises(ValueError, match="past the end"):
        await threads.fork_thread(rt, source, at=99)


async def test_export_is_the_journal_as_json_lines_or_the_turns_as_markdown(rt: Runtime) -> None:
    thread_id = await a_thread(rt, "hello", "again")
    exported = await threads.export_thread(rt, thread_id, "jsonl")
    metadata, journal = await threads.read_journal(rt, thread_id)
    lines = exported.text.splitlines()
    assert exported.events == len(journal) == len(lines) - 1 == 4
    assert loads(lines[0].encode()) == metadata and exported.metadata == metadata
    assert [loads(line.encode()) for line in lines[1:]] == journal
    markdown = await threads.export_thread(rt, thread_id, threads.ExportFormat.MARKDOWN)
    assert markdown.text.startswith("# origin\n") and "## Turn 2" in markdown.text
    assert "**You:**\n\nagain" in markdown.text and markdown.events == 4
    with pytest.raises(ThreadNotFoundError):
        await threads.export_thread(rt, "nosuch", "markdown")
    with pytest.raises(ValueError):
        await threads.export_thread(rt, thread_id, "pdf")


async def test_prune_deletes_old_threads_but_keeps_the_newest_and_the_held(rt: Runtime) -> None:
    ids = [await a_thread(rt, f"t{n}", title=None) for n in range(4)]
    cutoff = int(time.time() * 1000) + 60_000  # every thread is older than this
    seen: list[tuple[int, int]] = []
    plan = await threads.plan_prune(
        rt, older_than_ms=cutoff, keep_last=1, on_progress=lambda d, t: seen.append((d, t))
    )
    newest_first = [t.metadata.thread_id for t in plan.threads]
    assert plan.thread_count == 4 and sorted(newest_first) == sorted(ids[:3])
    assert seen == [(1, 3), (2, 3), (3, 3)] and all(t.size_bytes > 0 for t in plan.threads)
    held = newest_first[0]
    async with rt.start_session(held, owner="the holder"):
        result = await threads.prune_threads(rt, plan)
    assert sorted(t.metadata.thread_id for t in result.deleted) == sorted(newest_first[1:])
    [(kept, busy)] = result.busy
    assert kept.metadata.thread_id == held and busy.holder is not None
    assert busy.holder.owner == "the holder" and "the holder" in str(busy)
    left = {m.thread_id for m in await threads.all_threads(rt)}
    assert left == {ids[3], held}


async def test_delete_is_refused_while_a_session_holds_the_thread(
    store_factory: ThreadStoreFactory,
) -> None:
    async with runtime_on(store_factory) as rt, runtime_on(store_factory) as other:
        thread_id = await a_thread(rt, "busy")
        async with rt.start_session(thread_id, owner="worker-7"):
            for deleter in (rt, other):  # this runtime, and another on the same store
                with pytest.raises(ThreadBusyError) as refused:
                    await deleter.delete_thread(thread_id)
                assert refused.value.holder is not None
                assert refused.value.holder.owner == "worker-7"
            assert (await rt.get_thread(thread_id)).item_count == 2
        await other.delete_thread(thread_id)
        with pytest.raises(ThreadNotFoundError):
            await rt.get_thread(thread_id)
        with pytest.raises(ThreadNotFoundError):
            await rt.delete_thread(thread_id)


async def test_migrate_copies_every_thread_verbatim_to_each_store(
    tmp_path: Path, store_factory: ThreadStoreFactory
) -> None:
    source = JsonlThreadStoreFactory(base_path=tmp_path / "source")
    async with runtime_on(source) as rt:
        ids = [await a_thread(rt, f"m{n}") for n in range(3)]
        journals = {i: await threads.read_journal(rt, i) for i in ids}
    progress: list[tuple[int, int]] = []
    results: list[threads.ThreadResult] = []
    report = await threads.migrate(
        source,
        store_factory,
        chunk=3,
        on_progress=lambda d, t: progress.append((d, t)),
        on_result=results.append,
    )
    assert report.count("copied") == 3 and report.count("failed") == 0
    assert progress == [(1, 3), (2, 3), (3, 3)] and results == report.results
    async with runtime_on(store_factory) as target:
        assert {i: await threads.read_journal(target, i) for i in ids} == journals
    again = await threads.migrate(source, store_factory)
    assert again.count("skipped") == 3 and again.to_json()["events_copied"] == 0


async def test_migrate_from_a_missing_source_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch"
    target = SqliteThreadStoreFactory(tmp_path / "target.sqlite3")
    with pytest.raises(StoreError, match="does not exist"):
        await threads.migrate(
            JsonlThreadStoreFactory(base_path=missing), target, source_settings={}
        )
    assert not missing.exists() and not (tmp_path / "target.sqlite3").exists()


async def test_check_threads_finds_and_repairs_damage_in_a_jsonl_store(tmp_path: Path) -> None:
    base = tmp_path / "threads"
    async with runtime_on(JsonlThreadStoreFactory(base_path=base)) as rt:
        good = await a_thread(rt, "fine")
        bad = await a_thread(rt, "one", "two")
    journal = base / "threads" / f"{bad}.jsonl"
    lines = journal.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"text":"', b'"text":"X', 1)  # mid-file damage
    journal.write_bytes(b"\n".join(lines))
    async with runtime_on(JsonlThreadStoreFactory(base_path=base)) as rt:
        seen: list[threads.ThreadCheck] = []
        found = await threads.check_threads(rt, on_thread=seen.append)
        assert {t.check.thread_id: t.status for t in found.threads} == {
            good: "ok",
            bad: "damaged",
        }
        assert seen == found.threads and found.reindexed is None
        repaired = await threads.check_threads(rt, repair=True, reindex=True)
        assert repaired.count("repaired") == 1 and repaired.reindexed == 2
        assert (await threads.check_threads(rt)).count("damaged") == 0


async def test_check_threads_refuses_a_store_it_cannot_check(tmp_path: Path) -> None:
    async with runtime_on(SqliteThreadStoreFactory(tmp_path / "t.sqlite3")) as rt:
        with pytest.raises(StoreError, match="checks JSONL thread stores"):
            await threads.check_threads(rt)


class Stalling(MemoryThreadStore):
    """A memory store whose chosen operations stop answering."""

    stalled: frozenset[str] = frozenset()

    async def fault_point(self, operation: str, thread_id: str | None) -> None:
        if operation in self.stalled:
            await anyio.sleep_forever()


@pytest.mark.parametrize(
    ("operation", "stalls"),
    [
        ("fork", "read_events"),
        ("fork", "import_events"),
        ("export", "read_events"),
        ("prune", "list_threads"),
        ("prune", "thread_size_bytes"),
        ("delete", "delete_thread"),
    ],
)
async def test_every_operation_is_bounded_by_the_store_deadline(
    operation: str, stalls: str
) -> None:
    config = RuntimeConfig(turn_timeout_s=0.3)
    async with runtime_on(MemoryThreadStoreFactory(store_class=Stalling), config) as rt:
        thread_id = await a_thread(rt, "x")
        store = await rt.store()
        assert isinstance(store, Stalling)
        store.stalled = frozenset({stalls})
        with anyio.fail_after(20), pytest.raises(StoreError) as late:
            if operation == "fork":
                await threads.fork_thread(rt, thread_id)
            elif operation == "export":
                await threads.export_thread(rt, thread_id)
            elif operation == "prune":
                await threads.plan_prune(rt, older_than_ms=int(time.time() * 1000) + 60_000)
            else:
                await rt.delete_thread(thread_id)
        assert "thread store 'memory' did not answer within 0.3 s" in str(late.value)
        store.stalled = frozenset()
        assert isinstance(await rt.get_thread(thread_id), ThreadMetadata)
