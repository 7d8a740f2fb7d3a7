"""A following session (``follow_journal=True``, as ``roder serve`` opens them): input another
process journaled goes before input submitted here after it, even while a turn runs here;
and the follower does not ask the store after each of this process's own appends (real
JSONL stores on disk; a second store object on the same directory stands for another
process)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import InputAccepted, TurnComplete, TurnStarted
from roder_api.inference import AgentInferenceRequest, Completed, InferenceTurnContext, MessageDelta
from roder_api.testing import Delay, ScriptedEngine, ScriptStep
from roder_api.threads import EventPage, ThreadMetadata, ThreadStore
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, Session

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every test under asyncio and under trio."""
    return str(request.param)


def _runtime(path: Path, first: Sequence[ScriptStep]) -> Runtime:
    def script(_ctx: InferenceTurnContext, _req: AgentInferenceRequest, n: int) -> list[Any]:
        return [*first] if n == 0 else [MessageDelta("ok"), Completed("stop")]

    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine(turns=script))
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    return Runtime(builder.build(), RuntimeConfig())


class CountedPages:
    """Counts the page reads (``event_page``) of a real store (the store is untouched)."""

    def __init__(self, store: ThreadStore) -> None:
        self.reads = 0
        page = store.event_page

        async def counted(thread_id: str, **kwargs: Any) -> EventPage:
            self.reads += 1
            return await page(thread_id, **kwargs)

        store.event_page = counted  # type: ignore[method-assign]


class CountedMetadata:
    """Counts the metadata reads (``get_thread``) of a real store (the store is untouched)."""

    def __init__(self, store: ThreadStore) -> None:
        self.reads = 0
        get = store.get_thread

        async def counted(thread_id: str) -> ThreadMetadata:
            self.reads += 1
            return await get(thread_id)

        store.get_thread = counted  # type: ignore[method-assign]


async def _until_complete(session: Session, turn_id: str) -> None:
    with anyio.fail_after(30):
        while True:
            event = (await session.next_event()).event
            if isinstance(event, TurnComplete) and event.turn_id == turn_id:
                return


async def test_input_journaled_elsewhere_goes_before_input_submitted_here_while_busy(
    tmp_path: Path,
) -> None:
    first = [MessageDelta("a"), Delay(0.6), MessageDelta("b"), Completed("stop")]
    async with _runtime(tmp_path / "threads", first) as rt:
        thread_id = (await rt.create_thread()).thread_id
        there = await JsonlThreadStoreFactory(base_path=tmp_path / "threads").open()
        try:
            async with rt.start_session(thread_id, follow_journal=True) as session:
                await session.submit_input("one", turn_id="t1")
                await anyio.sleep(0.3)  # the turn runs here and appends nothing meanwhile
                # Another process accepts input (its 202 is answered), then input comes here.
                await there.append_events(thread_id, [InputAccepted("t2", "two")])
                await session.submit_input("three", turn_id="t3")
                await _until_complete(session, "t3")
        finally:
            await there.aclose()
        events = [e.event for e in (await rt.event_page(thread_id, limit=1000)).events]
    started = [e.turn_id for e in events if isinstance(e, TurnStarted)]
    assert started == ["t1", "t2", "t3"], "answered in the order the journal accepted them"


async def test_the_follower_does_not_ask_the_store_after_each_append_here(
    tmp_path: Path,
) -> None:
    first = [step for i in range(30) for step in (MessageDelta(f"w{i} "), Delay(0.005))]
    async with _runtime(tmp_path / "threads", [*first, Completed("stop")]) as rt:
        thread_id = (await rt.create_thread()).thread_id
        counted = CountedMetadata(await rt.store())
        async with rt.start_session(thread_id, follow_journal=True) as session:
            before = counted.reads
            await session.submit_input("one", turn_id="t1")
            await _until_complete(session, "t1")
            during = counted.reads - before
    # Its own appends are handed over: main asked the store after every one of them.
    assert during <= 3, during


async def test_a_following_session_reads_the_metadata_once_when_it_opens(
    tmp_path: Path,
) -> None:
    async with _runtime(tmp_path / "threads", [MessageDelta("a"), Completed("stop")]) as rt:
        thread_id = (await rt.create_thread()).thread_id
        counted = CountedMetadata(await rt.store())
        async with rt.start_session(thread_id, follow_journal=True):
            opened = counted.reads
    # One read that the thread exists, one for the follower's start and the open turns.
    assert opened == 2


async def test_a_session_on_a_new_thread_reads_no_page_of_its_empty_journal(
    tmp_path: Path,
) -> None:
    async with _runtime(tmp_path / "threads", [MessageDelta("a"), Completed("stop")]) as rt:
        thread_id = (await rt.create_thread()).thread_id
        pages = CountedPages(await rt.store())
        async with rt.start_session(thread_id, follow_journal=True):
            assert pages.reads == 0, "the metadata said the journal is empty"
        await rt.run_turn(thread_id, "one")
        pages.reads = 0
        async with rt.start_session(thread_id, follow_journal=True):
            assert pages.reads == 1, "a journal with events is paged for leftovers"
