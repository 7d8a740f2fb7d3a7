"""A session that opens on a thread it creates (``Runtime.start_session(create=True)``).

The lease is taken and the thread created while the first turn starts, and nothing is
read back: the store's metadata is never asked for. Its journal waits for both: a taken
id or a refused lease is raised by ``submit``, nothing is journaled, and the lease is
left free; a close while the create runs waits for it and releases the lease. The create
starts once the first model request is sent (``request_sent``), or at the call's first
event, or as the session closes, or after ``HOLD_S``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from roder_api.errors import ThreadBusyError, ThreadExistsError, ThreadNotFoundError
from roder_api.events import InputAccepted, TurnAborted, TurnComplete, TurnStarted
from roder_api.inference import (
    AgentInferenceRequest,
    InferenceEvent,
    InferenceTurnContext,
    ProviderFailure,
    ProviderFailureKind,
    request_sent,
)
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadLease, ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStore, JsonlThreadStoreFactory
from roder_runtime import UserInput
from roder_runtime.session import _resume
from roder_runtime.session._recorder import EventRecorder
from roder_runtime.session._resume import HOLD_S, NewThread
from roder_runtime.store._journal import ThreadJournal

from .conftest import make_runtime
from .session_support import events_until, journal

pytestmark = [pytest.mark.anyio, pytest.mark.core]


async def test_a_session_creates_its_thread_and_reads_nothing_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        reads: list[str] = []
        for name in ("get_thread", "read_events", "replay_events", "event_page"):
            method = getattr(store, name)

            async def counted(*args: Any, _name: str = name, _m: Any = method, **kw: Any) -> Any:
                reads.append(_name)
                return await _m(*args, **kw)

            monkeypatch.setattr(store, name, counted)
        async with runtime.start_session("fresh", create=True) as session:
            await session.submit(UserInput("hello"), turn_id="t1")
            await events_until(session, TurnComplete)
            assert reads == []  # a new thread: its first turn read nothing back
        monkeypatch.undo()
        events = await journal(runtime, "fresh")
        assert isinstance(events[0], TurnStarted) and events[0].turn_id == "t1"
        assert isinstance(events[-1], TurnComplete)
        assert (await runtime.get_thread("fresh")).last_sequence == len(events)


async def test_a_taken_id_is_raised_by_submit_and_the_thread_is_untouched(
    tmp_path: Path,
) -> None:
    async with make_runtime(tmp_path) as runtime:
        await runtime.create_thread("taken")
        await runtime.persist_turn_item("taken", "old", UserMessage("mine"))
        async with runtime.start_session("taken", create=True) as session:
            with pytest.raises(ThreadExistsError):
                await session.submit(UserInput("hello"))
            assert session.idle  # nothing left to do: a server closes it
            with pytest.raises(ThreadExistsError):
                await session.submit(UserInput("again"))
        assert len(await journal(runtime, "taken")) == 1  # nothing journaled on it
        async with runtime.start_session("taken") as session:  # the lease was never held
            await session.submit(UserInput("hi"))
            assert isinstance((await session.next_event()).event, TurnStarted)


async def test_a_refused_lease_is_raised_by_submit_and_the_thread_stays_created(
    tmp_path: Path,
) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        async with store.lease("held", owner="someone else"):
            async with runtime.start_session("held", create=True) as session:
                with pytest.raises(ThreadBusyError) as refused:
                    await session.submit(UserInput("hello"))
                assert refused.value.holder is not None
                assert refused.value.holder.owner == "someone else"
        assert (await runtime.get_thread("held")).last_sequence == 0
        async with runtime.start_session("held") as session:
            await session.submit(UserInput("hi"))
            assert isinstance((await session.next_event()).event, TurnStarted)


async def test_the_first_turn_waits_for_a_slow_create_and_a_close_meanwhile_frees_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        create = store.create_thread
        started = anyio.Event()

        async def slow(metadata: ThreadMetadata) -> ThreadMetadata:
            started.set()
            await anyio.sleep(0.5)
            return await create(metadata)

        monkeypatch.setattr(store, "create_thread", slow)
        with anyio.fail_after(20):
            async with runtime.start_session("slow", create=True) as session:
                await started.wait()  # open: the create still under way
                with pytest.raises(ThreadNotFoundError):
                    await runtime.get_thread("slow")  # opened before the thread exists
                await session.submit(UserInput("hello"), turn_id="t1")  # journaled: made
                assert (await runtime.get_thread("slow")).last_sequence >= 1
                await events_until(session, TurnComplete)
            async with runtime.start_session("closing", create=True):
                await started.wait()
            # Closed while its create ran: the create finished, the lease was released.
            assert (await runtime.get_thread("closing")).last_sequence == 0
            async with store.lease("closing", owner="after"):
                pass
        events = await journal(runtime, "slow")
        assert isinstance(events[0], TurnStarted) and isinstance(events[-1], TurnComplete)


class SlowFirstEngine(ScriptedEngine):
    """A scripted engine whose answer starts 0.1 s after it is called (``calls`` counts)."""

    calls = 0

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        self.calls += 1
        await anyio.sleep(0.1)
        async with aclosing(super().stream_turn(ctx, request)) as events:
            async for event in events:
                yield event


async def test_what_is_recorded_while_the_thread_is_made_goes_in_its_first_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model's output comes after the turn's start was handed to the recorder.
    engine = SlowFirstEngine()
    async with make_runtime(tmp_path, engine) as runtime:
        store = await runtime.store()
        create = store.create_thread
        made = anyio.Event()

        async def slow(metadata: ThreadMetadata) -> ThreadMetadata:
            await made.wait()
            return await create(metadata)

        monkeypatch.setattr(store, "create_thread", slow)
        appends: list[int] = []
        append = store.append_events

        async def counted(thread_id: str, events: Any, **kwargs: Any) -> Any:
            appends.append(len(events))
            return await append(thread_id, events, **kwargs)

        monkeypatch.setattr(store, "append_events", counted)
        with anyio.fail_after(20):
            async with runtime.start_session("made", create=True) as session:
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(session.submit, UserInput("hello"))
                    # The engine is called, and the turn's start and the model's first
                    # output are recorded, while the create waits (nothing journaled yet).
                    await anyio.sleep(0.5)
                    waiting = session.recorder.held
                    assert engine.calls == 1
                    assert waiting >= 4  # TurnStarted, the input, ModelStepStarted, a delta
                    assert appends == []
                    made.set()
                await events_until(session, TurnComplete)
        events = await journal(runtime, "made")
        assert isinstance(events[0], TurnStarted) and isinstance(events[-1], TurnComplete)
        assert appends[0] == waiting, f"appends of {appends}: the first took not all that waited"
        assert session.recorder.batches == len(appends)


async def test_input_journaled_elsewhere_on_the_new_thread_is_answered_after_its_first_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/sessions.md: input another process journals on the new thread before its first
    turn is journaled is answered after that turn (a second store object on the same
    directory stands for the other process)."""
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        other = await JsonlThreadStoreFactory(base_path=tmp_path).open()
        create = store.create_thread

        async def create_then_other_appends(metadata: ThreadMetadata) -> ThreadMetadata:
            made = await create(metadata)
            await other.append_events(metadata.thread_id, [InputAccepted("theirs", "also me")])
            return made

        monkeypatch.setattr(store, "create_thread", create_then_other_appends)
        try:
            with anyio.fail_after(30):
                async with runtime.start_session(
                    "raced", create=True, follow_journal=True
                ) as session:
                    await session.submit(UserInput("hello"), turn_id="mine")
                    await events_until(session, TurnComplete, count=2)
        finally:
            await other.aclose()
        events = await journal(runtime, "raced")
        assert isinstance(events[0], InputAccepted) and events[0].turn_id == "theirs"
        started = [e.turn_id for e in events if isinstance(e, TurnStarted)]
        ended = [e.turn_id for e in events if isinstance(e, TurnComplete)]
        assert started == ["mine", "theirs"] and ended == ["mine", "theirs"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio orders a batch at random
async def test_the_journal_opens_as_the_second_of_create_and_lease_ends(
    jsonl_store: JsonlThreadStore,
) -> None:
    """The first append waits for the gate, not for ``NewThread.run`` to finish: the gate
    opens when the create (here the later of the two) ends, before run's task group
    exits."""
    journal = ThreadJournal(jsonl_store, "gate", store_name="thread store 'jsonl'")
    leased = anyio.Event()
    order: list[str] = []

    async def create() -> ThreadMetadata:
        await leased.wait()  # the create ends second
        return await jsonl_store.create_thread(ThreadMetadata("gate", 1000, 1000))

    @asynccontextmanager
    async def lease() -> AsyncIterator[ThreadLease]:
        async with jsonl_store.lease("gate", owner="test") as held:
            leased.set()
            yield held

    lease_cm = lease()
    made = NewThread(journal, cast(EventRecorder, SimpleNamespace()), lease_cm, create)

    async def first_append() -> None:
        await journal.created()
        order.append("journal open")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(first_append)
            await anyio.lowlevel.checkpoint()  # it waits at the gate
            held = await made.run()
            order.append("run returned")
        assert held is not None and made.error is None
        await lease_cm.__aexit__(None, None, None)
    assert order == ["journal open", "run returned"]


class SendingEngine(ScriptedEngine):
    """A scripted engine that builds its request over many loop passes, then says it is
    sent (``request_sent``) before it answers; ``log`` says what happened, in order."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        self.log.append("building")
        for _ in range(50):
            await anyio.lowlevel.checkpoint()  # a create started at once would run now
        self.log.append("sent")
        request_sent()
        async with aclosing(super().stream_turn(ctx, request)) as events:
            async for event in events:
                yield event


async def test_the_thread_is_made_once_the_first_model_request_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create's blocking work does not compete with the loop while the engine builds
    its request: it starts when the engine says the request is sent (fails when the
    create starts with the session)."""
    log: list[str] = []
    async with make_runtime(tmp_path, SendingEngine(log)) as runtime:
        store = await runtime.store()
        create = store.create_thread

        async def logged(metadata: ThreadMetadata) -> ThreadMetadata:
            log.append("create")
            return await create(metadata)

        monkeypatch.setattr(store, "create_thread", logged)
        with anyio.fail_after(10):
            async with runtime.start_session("sent", create=True) as session:
                await session.submit(UserInput("hello"), turn_id="t1")
                await events_until(session, TurnComplete)
        monkeypatch.undo()
        assert log == ["building", "sent", "create"]
        events = await journal(runtime, "sent")
        assert isinstance(events[0], TurnStarted) and isinstance(events[-1], TurnComplete)


async def test_without_a_model_call_the_thread_is_made_all_the_same(tmp_path: Path) -> None:
    """No turn, no request: the create starts after ``HOLD_S`` (an open session), or as
    the session closes (at once)."""
    async with make_runtime(tmp_path) as runtime:
        with anyio.fail_after(10):
            async with runtime.start_session("open", create=True):
                while True:
                    try:
                        made = await runtime.get_thread("open")
                        break
                    except ThreadNotFoundError:
                        await anyio.sleep(HOLD_S / 4)
            async with runtime.start_session("closed", create=True):
                pass
        assert made.last_sequence == 0
        assert (await runtime.get_thread("closed")).last_sequence == 0


class RefusingEngine(ScriptedEngine):
    """An engine whose call fails before any event (and never says it was sent)."""

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        raise ProviderFailure(ProviderFailureKind.INVALID_REQUEST, "refused")
        yield  # pragma: no cover - makes this an async generator


class SilentEngine(ScriptedEngine):
    """An engine that never says its request was sent, and after its first event waits
    until the thread is made (``made``, set by the test's create) before the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.made = anyio.Event()

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        async with aclosing(super().stream_turn(ctx, request)) as events:
            async for event in events:
                yield event
                await self.made.wait()  # the first event alone must let the create start


@pytest.mark.parametrize("engine", ["silent", "refusing", "none"])
async def test_the_hold_ends_without_the_hint_at_the_first_event_the_calls_end_or_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """With ``HOLD_S`` far beyond the test's deadline, only the other releases can make the
    thread: an engine that never calls ``request_sent`` (its first event), one that fails
    before any event (the call's end; the failed turn is journaled), and a session closed
    with no turn (its close). Fails when any of them is missing."""
    monkeypatch.setattr(_resume, "HOLD_S", 600.0)
    silent = SilentEngine()
    engines = {"silent": silent, "refusing": RefusingEngine(), "none": ScriptedEngine()}
    async with make_runtime(tmp_path, engines[engine]) as runtime:
        store = await runtime.store()
        create = store.create_thread

        async def made(metadata: ThreadMetadata) -> ThreadMetadata:
            try:
                return await create(metadata)
            finally:
                silent.made.set()

        monkeypatch.setattr(store, "create_thread", made)
        with anyio.fail_after(10):
            async with runtime.start_session("held", create=True) as session:
                if engine != "none":
                    await session.submit(UserInput("hello"), turn_id="t1")
                    await events_until(session)
        monkeypatch.undo()
        events = await journal(runtime, "held")  # made: ThreadNotFoundError otherwise
    if engine == "none":
        assert events == []
    else:
        ended = TurnComplete if engine == "silent" else TurnAborted
        assert isinstance(events[-1], ended) and events[-1].turn_id == "t1"
