"""The conformance kits catch stores and engines that break a rule, and pass good ones."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api.events import Event, JournalEvent
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
)
from roder_api.storekit import check_expected
from roder_api.testing import MemoryThreadStore, ScriptedEngine
from roder_api.testing.conformance import InferenceEngineConformance, ThreadStoreConformance
from roder_api.threads import UNSET, EventPage, ThreadLease, ThreadMetadata, ThreadPage, ThreadStore
from roder_jsonl_thread_store import JsonlThreadStore
from roder_sqlite_thread_store import SqliteThreadStore, SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio


class NonAtomicStore(ThreadStore):
    """A deliberately broken store: it appends a batch one event at a time."""

    def __init__(self, inner: ThreadStore) -> None:
        self.inner = inner

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        return await self.inner.create_thread(metadata)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        return await self.inner.get_thread(thread_id)

    async def update_thread(
        self, thread_id: str, *, title: str | None = UNSET, extra: Mapping[str, Any] = UNSET
    ) -> ThreadMetadata:
        return await self.inner.update_thread(thread_id, title=title, extra=extra)

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        out: list[JournalEvent] = []
        for event in events:  # the bug: one commit per event, not one per batch
            out.extend(await self.inner.append_events(thread_id, [event]))
        return out

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        await self.inner.import_events(thread_id, entries)

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        return await self.inner.read_events(thread_id, after=after, limit=limit)

    async def event_page(
        self, thread_id: str, *, before: int | None = None, limit: int = 50
    ) -> EventPage:
        return await self.inner.event_page(thread_id, before=before, limit=limit)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        return await self.inner.list_threads(cursor=cursor, limit=limit)

    async def delete_thread(self, thread_id: str) -> None:
        await self.inner.delete_thread(thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_kit_fails_a_non_atomic_store(jsonl_store: JsonlThreadStore) -> None:
    kit = ThreadStoreConformance()
    broken = NonAtomicStore(jsonl_store)
    with pytest.raises(AssertionError, match="a failed batch left events behind"):
        await kit.test_batch_append_is_atomic(broken)
    with pytest.raises(AssertionError, match="a batch was not given consecutive sequence numbers"):
        await kit.test_concurrent_appends_to_one_thread(broken)


async def test_the_same_checks_pass_the_real_store(jsonl_store: JsonlThreadStore) -> None:
    kit = ThreadStoreConformance()
    await kit.test_batch_append_is_atomic(jsonl_store)
    await kit.test_concurrent_appends_to_one_thread(jsonl_store)


class RacyConditionalStore(MemoryThreadStore):
    """A deliberately broken store: it checks the expected sequence, then appends later."""

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        if expected_last_sequence is not None:
            last = (await self.get_thread(thread_id)).last_sequence
            check_expected(thread_id, expected_last_sequence, last)
            await anyio.sleep(0.001)  # the bug: another writer can get in here
        return await super().append_events(thread_id, events)


class UncheckedConditionalStore(MemoryThreadStore):
    """A deliberately broken store: it ignores ``expected_last_sequence``."""

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        return await super().append_events(thread_id, events)


async def test_kit_fails_a_store_whose_conditional_append_races() -> None:
    kit = ThreadStoreConformance()
    with pytest.raises(AssertionError, match="the check and the write are not one step"):
        await kit.test_concurrent_conditional_appends(RacyConditionalStore())
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        await kit.test_conditional_append(UncheckedConditionalStore())
    await kit.test_concurrent_conditional_appends(MemoryThreadStore())
    await kit.test_conditional_append(MemoryThreadStore())


class RacySqliteStore(SqliteThreadStore):
    """A deliberately broken SQLite store: the conditional check runs outside the write."""

    async def submit_append(
        self,
        thread_id: str,
        events: list[Event],
        payloads: list[bytes],
        expected_last_sequence: int | None,
    ) -> list[JournalEvent]:
        if expected_last_sequence is not None:
            last = (await self.get_thread(thread_id)).last_sequence
            check_expected(thread_id, expected_last_sequence, last)
            await anyio.sleep(0.005)  # other work, as a real store would do here
        # The bug: another process can append between the check above and this write.
        return await super().submit_append(thread_id, events, payloads, None)


class RacySqliteFactory(SqliteThreadStoreFactory):
    """Opens :class:`RacySqliteStore` (picklable: the kit's children open it too)."""

    async def open(self) -> SqliteThreadStore:
        store = await super().open()
        racy = RacySqliteStore(self.path, durability=self.durability)
        await store.aclose()
        return racy


class ProcessLocalLeaseSqliteStore(SqliteThreadStore):
    """A deliberately broken SQLite store: its leases hold within one store object only."""

    def lease(self, thread_id: str, *, owner: str) -> AbstractAsyncContextManager[ThreadLease]:
        return ThreadStore.lease(self, thread_id, owner=owner)


class ProcessLocalLeaseFactory(SqliteThreadStoreFactory):
    """Opens :class:`ProcessLocalLeaseSqliteStore`."""

    async def open(self) -> SqliteThreadStore:
        store = await super().open()
        await store.aclose()
        return ProcessLocalLeaseSqliteStore(self.path)


async def test_kit_fails_a_store_whose_check_and_write_race_across_processes(
    tmp_path: Path,
) -> None:
    kit = ThreadStoreConformance()
    broken = RacySqliteFactory(tmp_path / "racy.sqlite3")
    store = await broken.open()
    try:
        with pytest.raises(AssertionError, match="not one step across processes"):
            await kit.test_conditional_appends_from_two_processes(store, broken, tmp_path)
    finally:
        await store.aclose()
    good = SqliteThreadStoreFactory(tmp_path / "good.sqlite3")
    store = await good.open()
    try:
        await kit.test_conditional_appends_from_two_processes(store, good, tmp_path)
    finally:
        await store.aclose()


async def test_kit_fails_a_store_whose_lease_holds_in_one_object(tmp_path: Path) -> None:
    kit = ThreadStoreConformance()
    broken = ProcessLocalLeaseFactory(tmp_path / "leases.sqlite3")
    store = await broken.open()
    try:
        with pytest.raises(AssertionError, match="a second holder got the lease"):
            await kit.test_lease_is_held_by_one_holder(store, broken)
        with pytest.raises(AssertionError, match="given while a child held it"):
            await kit.test_lease_across_processes(store, broken, tmp_path)
    finally:
        await store.aclose()


def test_kit_run_by_pytest_reports_the_broken_rules(tmp_path: Path) -> None:
    # What a third-party plugin writes: a few lines subclassing the kit.
    (tmp_path / "test_broken_plugin.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from roder_api.testing.conformance import ThreadStoreConformance
            from roder_jsonl_thread_store import JsonlThreadStoreFactory
            from tests.test_conformance_kits import NonAtomicStore

            class BrokenFactory(JsonlThreadStoreFactory):
                id = "broken"

                async def open(self):
                    return NonAtomicStore(await super().open())

            class TestBrokenStore(ThreadStoreConformance):
                @pytest.fixture
                def thread_store_factory(self, tmp_path):
                    return BrokenFactory(tmp_path / "threads")
            """
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "atomic or one_thread or sequences",
            str(tmp_path / "test_broken_plugin.py"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**_env(), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    failed = {line.split("::")[-1] for line in result.stdout.splitlines() if "FAILED" in line}
    assert {name.split(" ")[0] for name in failed} == {
        "test_batch_append_is_atomic[asyncio]",
        "test_batch_append_is_atomic[trio]",
        "test_concurrent_appends_to_one_thread[asyncio]",
        "test_concurrent_appends_to_one_thread[trio]",
    }
    assert "4 failed, 2 passed" in result.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("RODER_", "PYTEST_"))}


# --- the engine kit -------------------------------------------------------------------------


class TestScriptedEngineConformance(InferenceEngineConformance):
    """The scripted engine (with native compaction) passes the engine kit."""

    @pytest.fixture
    def inference_engine(self) -> InferenceEngine:
        return ScriptedEngine()


class TestScriptedEngineWithoutCompaction(InferenceEngineConformance):
    """So does the scripted engine without native compaction."""

    @pytest.fixture
    def inference_engine(self) -> InferenceEngine:
        return ScriptedEngine(native_compaction=False)


class DoubleCompletionEngine(InferenceEngine):
    """A deliberately broken engine: it goes on after ``Completed``."""

    id = "double"

    async def stream_turn(  # type: ignore[override]
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        yield MessageDelta("hi")
        yield Completed()
        yield MessageDelta("after the end")
        yield Completed()


async def test_engine_kit_fails_a_broken_engine() -> None:
    kit = InferenceEngineConformance()
    with pytest.raises(AssertionError, match="expected one Completed or Failed"):
        await kit.test_stream_turn_shape(DoubleCompletionEngine())


def test_the_documented_kit_examples_run(tmp_path: Path) -> None:
    doc = (
        Path(__file__).resolve().parent.parent / "docs" / "writing-a-thread-store.md"
    ).read_text()
    examples = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "class Test" in b]
    assert len(examples) == 2
    for index, example in enumerate(examples):
        (tmp_path / f"test_doc_example_{index}.py").write_text(example)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "create_get or atomic or stream_turn_shape",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout
