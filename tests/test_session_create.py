"""A session that opens on a thread it creates (``Runtime.start_session(create=True)``).

The lease is taken and the thread created while the first turn starts, and nothing is
read back: the store's metadata is never asked for. Its journal waits for both: a taken
id or a refused lease is raised by ``submit``, nothing is journaled, and the lease is
left free; a close while the create runs waits for it and releases the lease. The thread
is made with the journal's first append (``ThreadStore.create_thread_with_events``, one
store call), or alone when nothing is to be appended. The create starts once the first
model request is sent (``request_sent``), or at the call's first event, or as the session
closes, or after ``HOLD_S``.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from roder_api.errors import ThreadBusyError, ThreadExistsError, ThreadNotFoundError
from roder_api.events import (
    AssistantContentDelta,
    Event,
    InputAccepted,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    WarningEvent,
)
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


def around_creates(
    monkeypatch: pytest.MonkeyPatch,
    store: Any,
    before: Callable[[ThreadMetadata, Sequence[Event]], Awaitable[None]],
    after: Callable[[ThreadMetadata], Awaitable[None]] | None = None,
) -> None:
    """Run ``before`` (given the events the thread is made with, none when made alone)
    and ``after`` around every way a session makes its thread (alone, with its events,
    with its events under its lease)."""
    create, create_with = store.create_thread, store.create_thread_with_events

    async def alone(metadata: ThreadMetadata) -> ThreadMetadata:
        await before(metadata, ())
        made = await create(metadata)
        if after is not None:
            await after(metadata)
        return made

    async def with_events(metadata: ThreadMetadata, events: Sequence[Event]) -> Any:
        await before(metadata, events)
        made = await create_with(metadata, events)
        if after is not None:
            await after(metadata)
        return made

    lease_new = store.lease_new_thread

    def leased(metadata: ThreadMetadata, events: Sequence[Event], *, owner: str) -> Any:
        @asynccontextmanager
        async def made() -> AsyncIterator[Any]:
            await before(metadata, events)
            async with lease_new(metadata, events, owner=owner) as thread:
                if after is not None:
                    await after(metadata)
                yield thread

        return made()

    monkeypatch.setattr(store, "create_thread", alone)
    monkeypatch.setattr(store, "create_thread_with_events", with_events)
    monkeypatch.setattr(store, "lease_new_thread", leased)


def appends_of(monkeypatch: pytest.MonkeyPatch, store: Any) -> list[list[Event]]:
    """Return the list the store's ``append_events`` calls are recorded in (their events)."""
    appended: list[list[Event]] = []
    append = store.append_events

    async def counted(thread_id: str, events: Any, **kwargs: Any) -> Any:
        appended.append(list(events))
        return await append(thread_id, events, **kwargs)

    monkeypatch.setattr(store, "append_events", counted)
    return appended


@pytest.mark.parametrize("follow", [False, True])
async def test_a_session_creates_its_thread_and_reads_nothing_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, follow: bool
) -> None:
    """Nor does its follower (``follow_journal=True``, ``roder serve``'s): it starts after
    the events the thread was made with, and is handed the session's later appends."""
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        reads: list[str] = []
        for name in ("get_thread", "read_events", "replay_events", "event_page"):
            method = getattr(store, name)

            async def counted(*args: Any, _name: str = name, _m: Any = method, **kw: Any) -> Any:
                reads.append(_name)
                return await _m(*args, **kw)

            monkeypatch.setattr(store, name, counted)
        async with runtime.start_session("fresh", create=True, follow_journal=follow) as session:
            await session.submit(UserInput("hello"), turn_id="t1")
            await events_until(session, TurnComplete)
            await anyio.sleep(0.05)  # the follower has taken the last append
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
        started = anyio.Event()

        async def slow(metadata: ThreadMetadata, events: Sequence[Event]) -> None:
            started.set()
            await anyio.sleep(0.5)

        around_creates(monkeypatch, store, slow)
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


async def test_what_is_recorded_while_the_thread_is_made_goes_in_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model's output comes after the turn's start was handed to the recorder.
    engine = SlowFirstEngine()
    async with make_runtime(tmp_path, engine) as runtime:
        store = await runtime.store()
        made = anyio.Event()
        made_with: list[int] = []

        async def slow(metadata: ThreadMetadata, events: Sequence[Event]) -> None:
            await made.wait()
            made_with.append(len(events))

        around_creates(monkeypatch, store, slow)
        appended = appends_of(monkeypatch, store)
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
                    assert appended == []
                    made.set()
                await events_until(session, TurnComplete)
        events = await journal(runtime, "made")
        assert isinstance(events[0], TurnStarted) and isinstance(events[-1], TurnComplete)
        # The thread was made with the turn's start (what was recorded until the request
        # went out, the hold's end), and what came while it was made (the model's output)
        # went in the one append right after it: nothing waited longer.
        assert made_with == [3], f"made with {made_with}"
        assert len(appended[0]) == waiting - 3, f"appends of {appended}: the first took not all"
        assert session.recorder.batches == 1 + len(appended)


async def test_what_is_recorded_while_the_thread_is_made_is_journaled_in_its_store_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit's stores with file leases (``BlockingThreadStore.lease_new_thread``'s
    ``follow_on``): the model's first output, recorded while the worker thread makes the
    thread, is journaled by that worker call right after the thread's first events, not by
    an append of its own once the create is back (the path to the first streamed token)."""
    async with make_runtime(tmp_path, SlowFirstEngine()) as runtime:
        store = await runtime.store()
        assert isinstance(store, JsonlThreadStore)
        release = threading.Event()
        create = store.create_with_follow_on_sync
        made_with: list[int] = []

        def slow_create(metadata: ThreadMetadata, events: Any, payloads: Any, f: Any) -> Any:
            release.wait(10)  # in the worker thread, after the lease
            made_with.append(len(events))
            return create(metadata, events, payloads, f)

        monkeypatch.setattr(store, "create_with_follow_on_sync", slow_create)
        appended = appends_of(monkeypatch, store)
        with anyio.fail_after(20):
            async with runtime.start_session("made", create=True) as session:
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(session.submit, UserInput("hello"))
                    # The turn's start is with the create; the model's output is recorded
                    # while it waits (the start, the input, the step's start, a delta).
                    while session.recorder.held < 4:  # noqa: ASYNC110 - its state, no event
                        await anyio.sleep(0.01)
                    release.set()
                delivered = await events_until(session, TurnComplete)
        events = await journal(runtime, "made")
        assert made_with == [3]  # the turn's start, before the model answered
        assert [entry.event for entry in delivered] == events  # in order, each once
        assert [entry.sequence for entry in delivered] == list(range(1, len(events) + 1))
        first_delta = next(e for e in events if isinstance(e, AssistantContentDelta))
        assert all(first_delta not in batch for batch in appended), appended
        assert session.recorder.batches == 1 + len(appended)


async def test_a_store_without_the_follow_on_loses_nothing_offered_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a ``lease_new_thread`` that is not the kit's (a wrapper with the old
    signature: PostgreSQL's or a test's are alike), what the recorder had queued when the
    create began, handed to the FollowOn and never taken, is journaled next, in order."""
    async with make_runtime(tmp_path, SlowFirstEngine()) as runtime:
        store = await runtime.store()
        lease_new = store.lease_new_thread

        def old_signature(metadata: ThreadMetadata, events: Sequence[Event], *, owner: str) -> Any:
            return lease_new(metadata, events, owner=owner)

        monkeypatch.setattr(store, "lease_new_thread", old_signature)
        async with runtime.start_session("made", create=True) as session:
            recorder, follow = session.recorder, session.recorder.follow
            note = WarningEvent("queued as the create began")

            def queued_first(follow_on: Any) -> bool:
                recorder.record(note)  # recorded after the first batch was taken
                return follow(follow_on)

            monkeypatch.setattr(recorder, "follow", queued_first)
            await session.submit(UserInput("hello"))
            delivered = await events_until(session, TurnComplete)
        events = await journal(runtime, "made")
        assert note in events and events.index(note) == 3  # after the turn's first three
        assert [entry.event for entry in delivered] == events
        assert isinstance(events[-1], TurnComplete)


async def test_input_journaled_elsewhere_on_the_new_thread_is_answered_after_its_first_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/sessions.md: input another process journals on the new thread before its first
    turn is journaled is answered after that turn (a second store object on the same
    directory stands for the other process)."""
    async with make_runtime(tmp_path) as runtime:
        store = await runtime.store()
        other = await JsonlThreadStoreFactory(base_path=tmp_path).open()

        async def nothing(metadata: ThreadMetadata, events: Sequence[Event]) -> None:
            pass

        async def other_appends(metadata: ThreadMetadata) -> None:
            await other.append_events(metadata.thread_id, [InputAccepted("theirs", "also me")])

        around_creates(monkeypatch, store, nothing, other_appends)
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
        # The thread was made with the start of the first turn: the other input follows it.
        assert isinstance(events[0], TurnStarted) and events[0].turn_id == "mine"
        theirs = [e for e in events if isinstance(e, InputAccepted) and e.turn_id == "theirs"]
        assert len(theirs) == 1
        started = [e.turn_id for e in events if isinstance(e, TurnStarted)]
        ended = [e.turn_id for e in events if isinstance(e, TurnComplete)]
        assert started == ["mine", "theirs"] and ended == ["mine", "theirs"]


async def test_the_first_append_makes_the_thread_with_its_events_once_the_lease_is_held(
    jsonl_store: JsonlThreadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's first append hands its events to ``NewThread.run``, which makes the
    thread with them in one store call once the lease is taken: no create alone, no
    append, and the append returns them journaled (fails when the thread is made first
    and the events appended after)."""
    journal = ThreadJournal(jsonl_store, "gate", store_name="thread store 'jsonl'")
    order: list[str] = []
    calls: list[str] = []
    for name in ("create_thread", "create_thread_with_events", "append_events"):
        method = getattr(jsonl_store, name)

        async def counted(*args: Any, _name: str = name, _m: Any = method, **kw: Any) -> Any:
            calls.append(_name)
            order.append(_name)
            return await _m(*args, **kw)

        monkeypatch.setattr(jsonl_store, name, counted)

    @asynccontextmanager
    async def lease() -> AsyncIterator[ThreadLease]:
        async with jsonl_store.lease("gate", owner="test") as held:
            order.append("leased")
            yield held

    async def alone() -> ThreadMetadata:
        raise AssertionError("made alone although an append came")

    lease_cm = lease()
    recorder = SimpleNamespace(gather=None)
    made = NewThread(journal, cast(EventRecorder, recorder), lease_cm, alone)
    first: list[Event] = [TurnStarted("t1"), ItemCompleted("t1", UserMessage("hi"))]
    appended: list[Any] = []

    async def first_append() -> None:
        appended.extend(await journal.append(first))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(first_append)
            await anyio.lowlevel.checkpoint()  # it waits for the thread to be made
            assert calls == []
            made.go()
            held = await made.run()
        assert held is not None and made.error is None
        await lease_cm.__aexit__(None, None, None)
    assert order == ["leased", "create_thread_with_events"]
    assert [(e.sequence, e.event) for e in appended] == [(1, first[0]), (2, first[1])]
    assert (await jsonl_store.get_thread("gate")).last_sequence == 2


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

        async def logged(metadata: ThreadMetadata, events: Sequence[Event]) -> None:
            log.append("create")

        around_creates(monkeypatch, store, logged)
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

        async def nothing(metadata: ThreadMetadata, events: Sequence[Event]) -> None:
            pass

        async def made(metadata: ThreadMetadata) -> None:
            silent.made.set()

        around_creates(monkeypatch, store, nothing, made)
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
