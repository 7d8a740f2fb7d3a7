"""One turn's journal, seen as an OpenAI Responses API response and its stream events.

A response is a turn (``resp_<turn id>``). :class:`ResponseProjection` folds the turn's
journal events, in sequence order, into the Responses API's stream events and keeps the
``Response`` object they describe. The fold is deterministic: the same journal events give
the same events with the same ``sequence_number`` (a running count from 0), so a replay
(``GET /v1/responses/{id}?stream=true&starting_after=N``) is exactly the suffix of the live
stream it replays, from any worker, at any later time: it folds the turn from its start and
drops what the client already has.

What becomes what:
- assistant text: a ``message`` output item (``output_item.added``, ``content_part.added``,
  ``output_text.delta``..., ``output_text.done``, ``content_part.done``, ``output_item.done``);
- reasoning: a ``reasoning`` item with ``reasoning_text`` deltas;
- a call of a tool the *client* runs (a ``function`` tool of the request): a
  ``function_call`` item; the response then ends and the client sends its output;
- a call of one of Roder's own tools (run in the server): an ``mcp_call`` item with
  ``server_label`` ``roder``, completed (or failed) by its result; an approval it waits for
  is an ``mcp_approval_request`` item;
- the end: ``response.completed``, ``response.incomplete`` (interrupted: status
  ``cancelled``; stopped early: ``incomplete``) or ``response.failed`` (with the error).
Usage is everything the turn billed (compaction and retried attempts included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roder_api.events import (
    AbortReason,
    AssistantContentDelta,
    ContentPhase,
    ErrorEvent,
    InputAccepted,
    ItemCompleted,
    JournalEvent,
    ToolApprovalRequested,
    TurnAborted,
    TurnComplete,
    TurnStarted,
    UsageUpdated,
)
from roder_api.inference import TokenUsage
from roder_api.transcript import AssistantMessage, Reasoning, ToolCallRecord, ToolResultRecord

SERVER_LABEL = "roder"
"""The ``server_label`` of the ``mcp_call`` items of Roder's own tools."""

RESPONSE_PREFIX = "resp_"
"""A response id is this prefix and its turn id."""

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The stream events that end a response's stream."""


def response_id(turn_id: str) -> str:
    """Return the response id of a turn."""
    return RESPONSE_PREFIX + turn_id


def turn_id_of(response_id_: str) -> str | None:
    """Return the turn id of a response id, or None when it is not one of ours."""
    if not response_id_.startswith(RESPONSE_PREFIX) or len(response_id_) == len(RESPONSE_PREFIX):
        return None
    return response_id_[len(RESPONSE_PREFIX) :]


def usage_json(usage: TokenUsage) -> dict[str, Any]:
    """Return a ``TokenUsage`` as the Responses API's ``usage`` object."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "cache_write_tokens": usage.cache_creation_prompt_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


@dataclass
class _Open:
    """An output item the stream has added and not yet finished."""

    index: int
    item_id: str
    text: str = ""


@dataclass
class ResponseProjection:
    """The fold of one turn's journal events into a Response and its stream events.

    ``client_tools``: names of the request's ``function`` tools (run by the client).
    ``created_at``: seconds; the time of the turn's first event when None.
    """

    thread_id: str
    turn_id: str
    model: str
    client_tools: frozenset[str] = frozenset()
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Sequence[Mapping[str, Any]] = ()
    background: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    status: str = "queued"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: TokenUsage = field(default_factory=TokenUsage)
    error: dict[str, Any] | None = None
    last_journal_sequence: int = 0
    sequence_number: int = -1
    _message: _Open | None = None
    _reasoning: _Open | None = None
    _calls: dict[str, int] = field(default_factory=dict)
    _last_error: str | None = None
    _started: bool = False

    @property
    def id(self) -> str:
        """Return the response id (``resp_<turn id>``)."""
        return response_id(self.turn_id)

    @property
    def done(self) -> bool:
        """Return True once the turn has ended (the stream has its terminal event)."""
        return self.status not in ("queued", "in_progress")

    def response(self) -> dict[str, Any]:
        """Return the Response object as it stands."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at or 0,
            "status": self.status,
            "background": self.background,
            "model": self.model,
            "instructions": self.instructions,
            "previous_response_id": self.previous_response_id,
            "conversation": {"id": self.thread_id},
            "output": [dict(item) for item in self.output],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [dict(t) for t in self.tools],
            "store": True,
            "metadata": dict(self.metadata),
            "error": self.error,
            "incomplete_details": None,
            "usage": usage_json(self.usage) if self.done else None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
        }

    def feed_all(self, events: Iterable[JournalEvent]) -> list[dict[str, Any]]:
        """Fold several journal events; return the stream events they make, in order."""
        out: list[dict[str, Any]] = []
        for entry in events:
            out.extend(self.feed(entry))
        return out

    def feed(self, entry: JournalEvent) -> list[dict[str, Any]]:
        """Fold one journal event (any thread event: others' turns are ignored)."""
        if entry.sequence <= self.last_journal_sequence or self.done:
            return []
        self.last_journal_sequence = entry.sequence
        event = entry.event
        if getattr(event, "turn_id", None) != self.turn_id:
            return []
        out: list[dict[str, Any]] = []
        if self.created_at is None:
            self.created_at = entry.recorded_at_ms / 1000
        if not self._started and isinstance(event, (InputAccepted, TurnStarted)):
            self._started = True
            self.status = "in_progress" if isinstance(event, TurnStarted) else "queued"
            self._emit(out, "response.created", response=self.response())
            if self.status == "in_progress":
                self._emit(out, "response.in_progress", response=self.response())
        elif isinstance(event, TurnStarted) and self.status == "queued":
            self.status = "in_progress"
            self._emit(out, "response.in_progress", response=self.response())
        if not self._started:
            return out  # events of a turn whose start this fold never saw
        if isinstance(event, AssistantContentDelta):
            self._delta(out, event)
        elif isinstance(event, ItemCompleted):
            self._item(out, event.item)
        elif isinstance(event, ToolApprovalRequested):
            self._approval(out, event)
        elif isinstance(event, UsageUpdated):
            self.usage = self.usage + event.usage
        elif isinstance(event, ErrorEvent):
            self._last_error = event.message
        elif isinstance(event, TurnComplete):
            self._finish(out, "completed")
        elif isinstance(event, TurnAborted):
            self._finish(out, _status_for(event.reason), event.reason)
        return out

    # --- the pieces -------------------------------------------------------------------------

    def _emit(self, out: list[dict[str, Any]], kind: str, **fields: Any) -> None:
        self.sequence_number += 1
        out.append({"type": kind, "sequence_number": self.sequence_number, **fields})

    def _add_item(self, out: list[dict[str, Any]], item: dict[str, Any]) -> int:
        self.output.append(item)
        index = len(self.output) - 1
        self._emit(out, "response.output_item.added", output_index=index, item=dict(item))
        return index

    def _done_item(self, out: list[dict[str, Any]], index: int, **changes: Any) -> None:
        self.output[index].update(changes)
        self._emit(
            out, "response.output_item.done", output_index=index, item=dict(self.output[index])
        )

    def _open_message(self, out: list[dict[str, Any]]) -> _Open:
        if self._message is None:
            item_id = f"msg_{self.turn_id}_{len(self.output)}"
            message = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            index = self._add_item(out, message)
            self._message = _Open(index, item_id)
            part = {"type": "output_text", "text": "", "annotations": []}
            self._emit(
                out,
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            )
        return self._message

    def _open_reasoning(self, out: list[dict[str, Any]]) -> _Open:
        if self._reasoning is None:
            item_id = f"rs_{self.turn_id}_{len(self.output)}"
            index = self._add_item(
                out, {"id": item_id, "type": "reasoning", "summary": [], "status": "in_progress"}
            )
            self._reasoning = _Open(index, item_id)
        return self._reasoning

    def _delta(self, out: list[dict[str, Any]], event: AssistantContentDelta) -> None:
        if event.phase is ContentPhase.REASONING:
            opened = self._open_reasoning(out)
            kind = "response.reasoning_text.delta"
            opened.text += event.delta
            self._emit(
                out,
                kind,
                item_id=opened.item_id,
                output_index=opened.index,
                content_index=0,
                delta=event.delta,
            )
            return
        opened = self._open_message(out)
        opened.text += event.delta
        self._emit(
            out,
            "response.output_text.delta",
            item_id=opened.item_id,
            output_index=opened.index,
            content_index=0,
            delta=event.delta,
            logprobs=[],
        )

    def _item(self, out: list[dict[str, Any]], item: object) -> None:
        if isinstance(item, AssistantMessage):
            opened = self._open_message(out)
            self._message = None
            text = item.text
            if text != opened.text:
                # Text journaled without its deltas (or cut short): the rest as one delta.
                rest = text[len(opened.text) :] if text.startswith(opened.text) else text
                if rest:
                    self._emit(
                        out,
                        "response.output_text.delta",
                        item_id=opened.item_id,
                        output_index=opened.index,
                        content_index=0,
                        delta=rest,
                        logprobs=[],
                    )
            part = {"type": "output_text", "text": text, "annotations": []}
            common = {"item_id": opened.item_id, "output_index": opened.index, "content_index": 0}
            self._emit(out, "response.output_text.done", text=text, logprobs=[], **common)
            self._emit(out, "response.content_part.done", part=part, **common)
            self._done_item(out, opened.index, status="completed", content=[part])
        elif isinstance(item, Reasoning):
            opened = self._open_reasoning(out)
            self._reasoning = None
            common = {"item_id": opened.item_id, "output_index": opened.index, "content_index": 0}
            self._emit(out, "response.reasoning_text.done", text=item.text, **common)
            content = [{"type": "reasoning_text", "text": item.text}]
            self._done_item(out, opened.index, status="completed", content=content)
        elif isinstance(item, ToolCallRecord):
            self._message = None
            self._call(out, item)
        elif isinstance(item, ToolResultRecord):
            self._result(out, item)

    def _call(self, out: list[dict[str, Any]], call: ToolCallRecord) -> None:
        if call.name in self.client_tools:
            item_id = f"fc_{call.id}"
            index = self._add_item(
                out,
                {
                    "id": item_id,
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": "",
                    "status": "in_progress",
                },
            )
            common = {"item_id": item_id, "output_index": index}
            self._emit(
                out, "response.function_call_arguments.delta", delta=call.arguments, **common
            )
            self._emit(
                out, "response.function_call_arguments.done", arguments=call.arguments, **common
            )
            self._done_item(out, index, arguments=call.arguments, status="completed")
            return
        item_id = f"mcp_{call.id}"
        index = self._add_item(
            out,
            {
                "id": item_id,
                "type": "mcp_call",
                "server_label": SERVER_LABEL,
                "name": call.name,
                "arguments": call.arguments,
                "status": "in_progress",
            },
        )
        self._calls[call.id] = index
        self._emit(out, "response.mcp_call.in_progress", item_id=item_id, output_index=index)

    def _result(self, out: list[dict[str, Any]], result: ToolResultRecord) -> None:
        index = self._calls.pop(result.id, None)
        if index is None:
            return  # a client tool's output arrives as input, not as output
        item_id = self.output[index]["id"]
        kind = "response.mcp_call.failed" if result.is_error else "response.mcp_call.completed"
        self._emit(out, kind, item_id=item_id, output_index=index)
        if result.is_error:
            self._done_item(out, index, status="failed", error=result.result, output=None)
        else:
            self._done_item(out, index, status="completed", output=result.result, error=None)

    def _approval(self, out: list[dict[str, Any]], event: ToolApprovalRequested) -> None:
        index = self._add_item(
            out,
            {
                "id": approval_request_id(event.call_id),
                "type": "mcp_approval_request",
                "server_label": SERVER_LABEL,
                "name": event.name,
                "arguments": event.arguments,
            },
        )
        self._done_item(out, index)

    def _finish(self, out: list[dict[str, Any]], status: str, reason: str | None = None) -> None:
        for call_index in list(self._calls.values()):
            # A call whose result the journal never got (the turn ended meanwhile).
            self._done_item(out, call_index, status="incomplete")
        self._calls.clear()
        self.status = status
        if status == "failed":
            message = self._last_error or f"the turn ended: {reason}"
            self.error = {"code": "server_error", "message": message}
            self._emit(out, "response.failed", response=self.response())
        elif status == "completed":
            self._emit(out, "response.completed", response=self.response())
        else:
            self._emit(out, "response.incomplete", response=self.response())


def approval_request_id(call_id: str) -> str:
    """Return the id of the ``mcp_approval_request`` item that asks about ``call_id``."""
    return f"mcpr_{call_id}"


def call_id_of_approval(request_id: str) -> str | None:
    """Return the call id an ``mcp_approval_request`` id stands for, or None."""
    return request_id[len("mcpr_") :] if request_id.startswith("mcpr_") else None


_FAILED = frozenset(
    {
        AbortReason.FAILED,
        AbortReason.PROCESS_EXITED,
        AbortReason.TIMEOUT,
        AbortReason.RUNTIME_CLOSED,
    }
)


def _status_for(reason: str) -> str:
    """Return the response status of a turn that ended with ``TurnAborted(reason)``."""
    if reason == AbortReason.INTERRUPTED:
        return "cancelled"
    if reason in _FAILED:
        return "failed"
    return "incomplete"
