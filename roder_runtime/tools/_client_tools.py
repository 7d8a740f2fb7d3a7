"""Client tools: tools a turn offers that the caller runs, not the runtime.

A turn may offer ``ToolSpec`` s that no registered tool implements (``UserInput(...,
client_tools=...)``): the OpenAI Responses API's ``function`` tools, run by the client.
When the model calls one, the runtime does not run it: the turn journals the call (a
``ToolCallRecord``) and ends with ``TurnComplete``, the call left open *by design* (it is
not a call a dead process left running: the crash rules never close it). The caller runs
it and sends the output as the next turn's input (``UserInput(..., tool_results=...)``):
each result must answer a call that is open in the thread's replay and not answered by an
input already queued, else :class:`~roder_api.errors.ToolCallNotOpenError` is raised
before anything is written. The results are journaled at the start of that turn, before
its model step, so replay hands the model the calls and their results in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from roder_api.errors import ToolCallNotOpenError
from roder_api.inference import ToolSpec
from roder_api.transcript import ToolCallRecord, ToolResultRecord, TranscriptItem, UserMessage
from roder_runtime.store._journal import ThreadJournal
from roder_runtime.tools._tool_step import PendingToolStep, ToolStep


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """What a turn is given besides its text: its tool step (None: no tools), the tool step
    a dead session left (``resume``), the caller's client tools and the results of client
    calls, and instructions for this turn only (None: the configured ones)."""

    tool_step: ToolStep | None = None
    resume: PendingToolStep | None = None
    client_tools: tuple[ToolSpec, ...] = ()
    tool_results: tuple[ToolResultRecord, ...] = ()
    instructions: str | None = None


def open_calls(items: Iterable[TranscriptItem]) -> dict[str, ToolCallRecord]:
    """Return the tool calls of ``items`` (a replay history) without a result, by id."""
    calls: dict[str, ToolCallRecord] = {}
    for item in items:
        if isinstance(item, ToolCallRecord):
            calls[item.id] = item
        elif isinstance(item, ToolResultRecord):
            calls.pop(item.id, None)
    return calls


def paired_results(
    results: Sequence[ToolResultRecord],
    calls: dict[str, ToolCallRecord],
    taken: set[str],
    thread_id: str,
) -> tuple[ToolResultRecord, ...]:
    """Return ``results`` named after the open calls they answer; raise
    ``ToolCallNotOpenError`` when one answers no open call (or one already answered)."""
    paired: list[ToolResultRecord] = []
    seen: set[str] = set()
    for result in results:
        call = calls.get(result.id)
        if call is None or result.id in taken or result.id in seen:
            state = "is already answered" if result.id in taken | seen else "is not open"
            raise ToolCallNotOpenError(thread_id, result.id, state)
        seen.add(result.id)
        paired.append(
            ToolResultRecord(
                call.id, call.name, result.result, result.display_payload, result.is_error
            )
        )
    return tuple(paired)


def input_items(text: str, results: Sequence[ToolResultRecord]) -> list[TranscriptItem]:
    """Return a turn's input items: the tool results it answers, then its user message
    (none when the text is empty and results are given: the results are the input)."""
    if results and not text:
        return [*results]
    return [*results, UserMessage(text)]


def check_client_tools(specs: Sequence[ToolSpec], registered: Iterable[str]) -> None:
    """Raise ``ValueError`` when client tools repeat a name or shadow a registered tool."""
    names = [spec.name for spec in specs]
    clashes = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(registered)))
    if clashes:
        raise ValueError(
            f"client tools {clashes} clash with each other or with registered tools; "
            "give each tool one name"
        )


@dataclass(slots=True)
class ClientTurns:
    """The client tools and tool results of the inputs a session queued, by turn id."""

    waiting: dict[str, TurnOptions] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)  # answered by turns already handed out

    def taken(self) -> set[str]:
        """Return the call ids answered by this session's inputs (queued or started)."""
        return self.started | {r.id for t in self.waiting.values() for r in t.tool_results}

    @asynccontextmanager
    async def hold(
        self,
        turn_id: str,
        client_tools: Sequence[ToolSpec],
        tool_results: Sequence[ToolResultRecord],
        journal: ThreadJournal,
        registered: Iterable[str],
        instructions: str | None = None,
    ) -> AsyncIterator[None]:
        """Check and keep a turn's input while it is submitted; drop it when that fails."""
        if not client_tools and not tool_results and instructions is None:
            yield
            return
        check_client_tools(client_tools, registered)
        results: tuple[ToolResultRecord, ...] = ()
        if tool_results:
            calls = open_calls(await journal.replay_history())
            results = paired_results(tool_results, calls, self.taken(), journal.thread_id)
        self.waiting[turn_id] = TurnOptions(None, None, tuple(client_tools), results, instructions)
        try:
            yield
        except BaseException:
            self.waiting.pop(turn_id, None)
            raise

    def take(self, turn_id: str) -> TurnOptions:
        """Return (and forget) what turn ``turn_id`` was given; empty when nothing."""
        given = self.waiting.pop(turn_id, TurnOptions())
        self.started.update(r.id for r in given.tool_results)
        return given
