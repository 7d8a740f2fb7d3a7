"""The runtime: threads on the configured store, engines from the registry, turns."""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from roder_api.errors import StoppedError, ThreadBusyError, ThreadNotFoundError
from roder_api.events import (
    AbortReason,
    Event,
    ItemCompleted,
    JournalEvent,
    TurnAborted,
    TurnComplete,
    UsagePurpose,
    UsageUpdated,
)
from roder_api.extension import ExtensionRegistry
from roder_api.inference import InferenceEngine, TokenUsage, ToolSpec
from roder_api.threads import ThreadMetadata, ThreadStoreFactory, validate_thread_id
from roder_api.tools import Tool
from roder_api.transcript import ToolResultRecord, TranscriptItem
from roder_runtime.compaction._estimates import sum_usage_by_purpose
from roder_runtime.config._check import load_registry
from roder_runtime.config._config import RuntimeConfig, load_config
from roder_runtime.model._catalog import DEFAULT_ENGINE, ModelCatalog
from roder_runtime.model._ids import new_id
from roder_runtime.session._ops import SessionStart, UserInput
from roder_runtime.store._guards import configured_store_factory, open_store
from roder_runtime.store._journal import (
    ReplayHistory,
    ThreadJournal,
    bounded_call,
    store_label,
)
from roder_runtime.store._observers import ObserverHub

if TYPE_CHECKING:  # sessions and compaction are imported when used: `threads list` needs none
    from roder_api.threads import EventPage, ThreadPage, ThreadSnapshot, ThreadStore
    from roder_runtime.compaction._compaction import CompactionResult
    from roder_runtime.model._call import PreemptSignal
    from roder_runtime.session._session import Session

__all__ = ["DEFAULT_ENGINE", "Emit", "Runtime", "load_registry"]

T = TypeVar("T")

Emit = Callable[[Sequence[Event]], Awaitable[None]]
"""Receive (deliver) a batch of events, in order, after they were persisted."""


class Runtime:
    """Threads on the configured thread store, engines from the registry, and turns.

    Use ``async with Runtime(registry, config)`` or call ``aclose()``. The store is opened on
    first use. A runtime made by :meth:`from_config` owns its registry and closes it.
    ``name`` is what a thread's lease says holds it (``roder chat``, your service's name).
    """

    def __init__(
        self,
        registry: ExtensionRegistry,
        config: RuntimeConfig | None = None,
        *,
        owns_registry: bool = False,
        name: str = "roder",
    ) -> None:
        self.registry = registry
        self.config = config if config is not None else RuntimeConfig()
        self.catalog = ModelCatalog(registry, self.config)
        """The engines, their default models and context windows (what turns need)."""
        self.name = name
        self._owns_registry = owns_registry
        self._store: ThreadStore | None = None
        self._store_lock = anyio.Lock()
        self._closed = False
        self._sessions: set[Session] = set()
        self.observers = ObserverHub(registry.observers) if registry.observers else None
        """The observer seam (None without observers: nothing is spent on it)."""

    @classmethod
    def from_config(
        cls,
        path_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Runtime:
        """Return a runtime configured from TOML (a path, a mapping, or ``config.toml``).

        Installed plugins are loaded from entry points (limited by ``RODER_PLUGINS``) and
        handed their settings.
        """
        config = load_config(path_or_mapping, environ=environ)
        return cls(load_registry(config), config, owns_registry=True)

    @classmethod
    async def open(
        cls,
        path_or_mapping: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Runtime:
        """Return :meth:`from_config`'s runtime, reading the file and importing the plugins
        in a worker thread so that async callers keep blocking I/O off the event loop.
        """
        config = await anyio.to_thread.run_sync(
            functools.partial(load_config, path_or_mapping, environ=environ)
        )
        registry = await anyio.to_thread.run_sync(load_registry, config)
        return cls(registry, config, owns_registry=True)

    # --- components ------------------------------------------------------------------------

    def thread_store_factory(self) -> ThreadStoreFactory:
        """Return the configured store factory (the only one, or ``jsonl`` among several)."""
        return configured_store_factory(self.registry, self.config.thread_store)

    async def store(self) -> ThreadStore:
        """Return the open thread store, opening it on first use."""
        if self._closed:
            raise StoppedError("the runtime is closed; create a new Runtime")
        if self._store is None:
            async with self._store_lock:
                if self._store is None:
                    self._store = await open_store(self.thread_store_factory())
        return self._store

    def engine(self, engine_id: str | None = None) -> InferenceEngine:
        """Return the engine ``engine_id``, or the default engine (``scripted`` when unset)."""
        return self.catalog.engine(engine_id)

    def default_model(self, engine: InferenceEngine) -> str:
        """Return the configured default model, or a name derived from the engine."""
        return self.catalog.default_model(engine)

    async def journal(self, thread_id: str) -> ThreadJournal:
        """Return the journal of one thread on the open store, each call bounded in time.

        The bound is ``turn_timeout_s`` (a default of two minutes when unset); a store that
        does not answer in time fails the call with a ``StoreError`` naming it.
        """
        store = await self.store()
        return ThreadJournal(
            store,
            validate_thread_id(thread_id),
            store_name=self._store_name,
            timeout_s=self.config.turn_timeout_s,
            observe=self.observers.offer if self.observers is not None else None,
        )

    @functools.cached_property
    def _store_name(self) -> str:  # the registry and the configuration are fixed
        return store_label(self.thread_store_factory())

    async def _bounded(self, what: str, call: Callable[[ThreadStore], Awaitable[T]]) -> T:
        """Return ``await call(store)`` within the deadline of :meth:`journal`."""
        store = await self.store()
        timeout_s = self.config.turn_timeout_s  # None: the default
        return await bounded_call(
            what, lambda: call(store), store_name=self._store_name, timeout_s=timeout_s
        )

    # --- threads -----------------------------------------------------------------------------

    async def create_thread(
        self,
        thread_id: str | None = None,
        *,
        title: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ThreadMetadata:
        """Create a thread (a fresh id when ``thread_id`` is None); return its metadata.

        Needs no lease: the store creates an id once (``ThreadExistsError`` when it is
        taken). Every store call of the thread methods is bounded like :meth:`journal`'s;
        fork, export, prune and migrate are in :mod:`roder_runtime.threads`.
        """
        thread_id = validate_thread_id(thread_id) if thread_id is not None else uuid.uuid4().hex
        now = int(time.time() * 1000)
        metadata = ThreadMetadata(thread_id, now, now, title, extra=dict(extra or {}))
        return await self._bounded(
            f"create of thread {thread_id!r}", lambda store: store.create_thread(metadata)
        )

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata; raise ``ThreadNotFoundError`` when absent."""
        return await self._bounded(
            f"metadata read of thread {thread_id!r}", lambda store: store.get_thread(thread_id)
        )

    async def append_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        *,
        expected_last_sequence: int | None = None,
    ) -> list[JournalEvent]:
        """Append events to a thread's journal as one atomic, durable batch.

        A write outside a session: it takes no lease, so it lands while a session holds the
        thread (here or in another process), between that session's own appends. What
        excludes a racing writer is the condition: with ``expected_last_sequence=N`` the
        batch lands only if the thread's last event is still sequence N (0: it has none);
        otherwise ``SequenceConflictError`` and nothing is written. The session does not
        answer an event appended this way (``Session.submit`` is the way to start a turn).
        """
        journal = await self.journal(thread_id)
        return await journal.append(events, expected_last_sequence=expected_last_sequence)

    async def persist_turn_item(
        self, thread_id: str, turn_id: str, item: TranscriptItem
    ) -> JournalEvent:
        """Append one completed transcript item to a turn of a thread.

        A write outside a session, unconditional: see :meth:`append_events` (no lease; it
        lands even while a session holds the thread).
        """
        (entry,) = await self.append_events(thread_id, [ItemCompleted(turn_id, item)])
        return entry

    async def persist_turn_items(
        self, thread_id: str, turn_id: str, items: Sequence[TranscriptItem]
    ) -> list[JournalEvent]:
        """Append completed transcript items to a turn of a thread as one atomic, durable batch.

        The batch form of :meth:`persist_turn_item`: one commit (one sync) for all of them;
        unconditional and without the lease, like :meth:`append_events`.
        """
        return await self.append_events(thread_id, [ItemCompleted(turn_id, i) for i in items])

    async def record_usage(
        self,
        thread_id: str,
        turn_id: str | None,
        usage: TokenUsage,
        *,
        purpose: str = UsagePurpose.TURN,
    ) -> JournalEvent:
        """Bill ``usage`` to a thread (``purpose``: turn, compaction, discarded_compaction).

        An unconditional append without the lease, like :meth:`append_events`.
        """
        (entry,) = await self.append_events(thread_id, [UsageUpdated(turn_id, usage, purpose)])
        return entry

    async def load_thread(self, thread_id: str) -> ThreadSnapshot | None:
        """Return a thread's metadata and whole history by turn, or None when absent.

        One store call (``ThreadStore.read_snapshot``), bounded like every journal call.
        """
        journal = await self.journal(thread_id)
        try:
            return await journal.snapshot()
        except ThreadNotFoundError:
            return None

    async def list_threads(self, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first."""
        return await self._bounded(
            "listing", lambda store: store.list_threads(cursor=cursor, limit=limit)
        )

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread; raise ``ThreadNotFoundError`` when absent.

        A write outside a session that must not run while one holds the thread: it takes
        the thread's lease for the delete, so while a session holds it (in this runtime, in
        another process or on another machine) it raises ``ThreadBusyError`` naming the
        holder and deletes nothing. Appends without the lease may still race it (they fail
        with ``ThreadNotFoundError`` once it is gone).
        """
        for session in self._sessions:
            if session.thread_id == thread_id and session.lease is not None:
                # The store's lease may let its own process in again (file locks do).
                raise ThreadBusyError(thread_id, session.lease.holder)
        journal = await self.journal(thread_id)
        store, owner = journal.store, f"{self.name} (delete)"

        async def delete() -> None:
            await store.get_thread(thread_id)  # absent: ThreadNotFoundError, no lease taken
            async with store.lease(thread_id, owner=owner):
                await store.delete_thread(thread_id)

        await journal.bounded("delete", delete)

    async def event_page(
        self, thread_id: str, before: int | None = None, limit: int = 50
    ) -> EventPage:
        """Return ``limit`` journal events below ``before`` (newest when None), ascending."""
        return await (await self.journal(thread_id)).event_page(before=before, limit=limit)

    async def replay_history(self, thread_id: str) -> ReplayHistory:
        """Return the transcript items from the last compaction boundary on.

        A list with ``sequence``, the thread's last event when it was read: hand it to
        :meth:`compact_with_provider`, which commits only if no item came after it.
        """
        return await (await self.journal(thread_id)).replay_history()

    # --- turns -------------------------------------------------------------------------------

    def start_session(
        self,
        thread_id: str,
        *,
        engine: str | None = None,
        model: str | None = None,
        owner: str | None = None,
        tools: Sequence[str] | None = None,
        follow_journal: bool = False,
        create: bool = False,
    ) -> SessionStart[Session]:
        """Return a running session on a thread (``engine``: an engine id, default the default).

        Use it as ``async with runtime.start_session(id) as session:`` (preferred), or await
        it (``session = await runtime.start_session(id)``, then ``aclose()``); open and close
        a session in the same task. The session holds the thread's lease until it closes
        (``owner``, default the runtime's ``name``, is what the lease says holds it): a second
        session on the thread — here, in another process or on another machine — raises
        ``ThreadBusyError`` naming the holder. ``ThreadNotFoundError`` when the thread does
        not exist. A turn that a dead process left running is closed first with
        ``TurnAborted(turn_id, "process_exited")`` — unless it was in a tool step: then its
        calls without results are finished by the crash rules and the turn goes on.

        ``tools`` chooses the tools the turns offer: None, every registered tool that
        ``[tools] enabled`` allows (all when it is unset); a list of names, exactly those
        (each must be registered: ``UnknownToolError``), whatever ``enabled`` says.

        ``follow_journal=True`` makes the session answer input that other processes
        journal on the thread without the lease (``InputAccepted``) and take the approval
        decisions they journal (``roder serve`` with several workers).

        ``create=True``: on a thread it creates under its lease as the first turn starts
        (``ThreadStore.lease_new_thread``); ``submit`` raises a taken id or refused lease.
        """
        owner = owner or self.name
        opening = self._open_session(
            thread_id, engine, model, owner, tools, follow=follow_journal, create=create
        )
        return SessionStart(opening)

    def offered_tools(self, names: Sequence[str] | None = None) -> dict[str, Tool]:
        """Return the tools a session offers for ``names`` (see ``start_session``)."""
        from roder_runtime.session._tools import offered_tools

        return offered_tools(self.registry, self.config.tools, names)

    async def _open_session(
        self,
        thread_id: str,
        engine: str | None,
        model: str | None,
        owner: str,
        tools: Sequence[str] | None = None,
        approvals: bool = True,
        *,
        follow: bool = False,
        create: bool = False,
    ) -> Session:
        from roder_runtime.session._session import Session
        from roder_runtime.session._tools import SessionTools

        offered = self.offered_tools(tools)
        chosen = self.engine(engine)
        model_id = model or self.default_model(chosen)
        if not create:
            await self.get_thread(thread_id)  # ThreadNotFoundError before any lease is taken
        journal = await self.journal(thread_id)
        session = Session(
            journal=journal,
            catalog=self.catalog,
            engine=chosen,
            model=model_id,
            lease=journal.store.lease(thread_id, owner=owner),
            on_close=self._sessions.discard,
            follow_journal=follow,
            tools=SessionTools(
                offered,
                self.config.tools,
                thread_id=thread_id,
                settings=self.config.plugin_settings(),
                approvals=approvals,
            ),
        )
        alone = functools.partial(self.create_thread, thread_id) if create else None
        lease_new = functools.partial(journal.lease_new, owner=owner) if create else None
        await session.start(alone, lease_new=lease_new)
        self._sessions.add(session)
        return session

    async def run_turn(
        self,
        thread_id: str,
        text: str,
        *,
        emit: Emit | None = None,
        engine: str | None = None,
        model: str | None = None,
        turn_id: str | None = None,
        tools: Sequence[str] | None = None,
        client_tools: Sequence[ToolSpec] = (),
        tool_results: Sequence[ToolResultRecord] = (),
    ) -> str | None:
        """Run one turn on a thread through a session: persist every event, then ``emit`` it.

        Return the assistant's reply (its final answer, after any tool steps), or None when
        the turn failed (its journal says why). ``tools`` as for ``start_session``; nobody
        can approve here, so calls whose policy is ``ask`` are denied. ``client_tools`` and
        ``tool_results`` as for :class:`UserInput` (a turn that calls a client tool returns
        its text so far, ``""`` when none; the open calls are in the journal).
        """
        opening = self._open_session(thread_id, engine, model, self.name, tools, approvals=False)
        async with SessionStart(opening) as session:
            turn_id = turn_id or new_id("turn")
            given = UserInput(text, (*client_tools,), (*tool_results,))
            async with session.tools.turn_input(turn_id, given, session.journal):
                turn_id = await session.submit_turn(text, turn_id)
            while True:
                entry = await session.next_event()
                event = entry.event
                if emit is not None:
                    await emit([event])
                if isinstance(event, TurnComplete) and event.turn_id == turn_id:
                    return event.last_assistant_message or ""
                if isinstance(event, TurnAborted) and event.turn_id == turn_id:
                    return None

    # --- compaction ------------------------------------------------------------------------------

    async def compact_with_provider(
        self,
        thread_id: str,
        turn_id: str,
        engine_id: str | None,
        model: str | None,
        history: Sequence[TranscriptItem],
        *,
        preempt: PreemptSignal | None = None,
    ) -> CompactionResult:
        """Compact ``history`` (the replay history) with the engine and commit the boundary.

        ``history`` is what :meth:`replay_history` returned: the commit is conditional on
        the sequence it was read at, so an item appended since discards the candidate
        (``conflict``). Another sequence of items is checked against the thread's replay
        history now, and is a ``conflict`` unless it is the same.
        Commit happens in one atomic append only after a clean stream; otherwise the usage
        observed is billed, the history is left exactly as it was, and ``CompactionFailed``
        (``.reason``) or ``CompactionPreempted`` is raised. See ``docs/compaction.md``.
        """
        from roder_runtime.compaction._compaction import compact

        engine = self.engine(engine_id)
        return await compact(
            await self.journal(thread_id),
            self.catalog,
            turn_id=turn_id,
            engine=engine,
            model=model or self.default_model(engine),
            history=history,
            preempt=preempt,
        )

    async def usage_by_purpose(self, thread_id: str) -> dict[str, TokenUsage]:
        """Return a thread's billed usage summed by purpose (turn, compaction, ...)."""
        return sum_usage_by_purpose(await (await self.journal(thread_id)).read_events())

    # --- lifecycle -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the sessions still open (their turns end as ``runtime_closed``), then the
        store (and the registry when this runtime built it)."""
        if self._closed:
            return
        for session in list(self._sessions):
            await session.aclose(reason=AbortReason.RUNTIME_CLOSED)
        self._closed = True
        store, self._store = self._store, None
        try:
            if self.observers is not None:
                await self.observers.aclose()
        finally:
            try:
                if store is not None:
                    await store.aclose()
            finally:
                if self._owns_registry:
                    await self.registry.aclose()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
