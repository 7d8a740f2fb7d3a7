"""A turn's edges: the one place that journals its input, and the one that composes its end.

An input is *accepted* once it is journaled (``submit`` returns only then): once as its
turn's items, and before that — when it must wait (queued behind a running turn, a steer, a
compaction that comes first) — as ``InputAccepted``. Every path asks
:meth:`SubmittedInput.journal` which, and it remembers what was journaled. Every path that
ends a turn (the driver, the session for a turn that never started, the resume of a dead
session's turn) journals what :func:`turn_end` composes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from roder_api.codec import check_value, dumps_json
from roder_api.events import (
    AbortReason,
    ErrorEvent,
    Event,
    InputAccepted,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.transcript import AssistantMessage, TranscriptItem, UserMessage
from roder_runtime.tools._tool_step import PendingToolStep


@dataclass(slots=True, eq=False)
class SubmittedInput:
    """An input and the turn it goes to (the session's queue entry).

    ``accepted``/``in_turn``: its ``InputAccepted``/its items are journaled; ``announce``
    False: journaled with its turn only (``run_turn``); ``direct``: submitted to an idle
    session, the turn's start journals it; ``journaled``: set once it is recorded (or the
    session stopped); ``resume``: a turn a dead session left in a tool step (``in_turn``);
    ``metadata``: the caller's, journaled once, on the turn's first event (:meth:`take_metadata`).
    """

    turn_id: str
    text: str
    accepted: bool = False
    announce: bool = True
    direct: bool = False
    steer: bool = False
    interrupted: bool = False
    resume: PendingToolStep | None = None
    in_turn: bool = False
    metadata: Mapping[str, Any] | None = None
    journaled: anyio.Event = field(default_factory=anyio.Event)

    def journal(self, items: Sequence[TranscriptItem] | None = None) -> list[Event]:
        """Return the events that journal this input now (none when that is done): with
        ``items`` (the input as its turn's items) those, once; else ``InputAccepted``,
        once, while neither is journaled and it is announced."""
        if items is not None:
            journaled, self.in_turn = self.in_turn, True
            return [] if journaled else [ItemCompleted(self.turn_id, item) for item in items]
        if self.accepted or self.in_turn or not self.announce:
            return []
        self.accepted = True
        return [InputAccepted(self.turn_id, self.text, self.steer, self.take_metadata())]

    def take_metadata(self) -> Mapping[str, Any] | None:
        """Return the caller's metadata for the event that journals it, once (then None):
        it rides on the turn's first event, its ``InputAccepted`` when the input waited,
        else its ``TurnStarted``."""
        metadata, self.metadata = self.metadata, None
        return metadata


def input_bytes(text: str, metadata: Mapping[str, Any] | None = None) -> int:
    """Return what an input weighs against ``max_input_bytes``: its text's UTF-8 bytes and
    its metadata's JSON, which is journaled with it (``UnserializableEventError`` when the
    metadata is not JSON data)."""
    size = len(text.encode("utf-8"))
    if metadata is not None:
        check_value(metadata, what="the input's metadata", depth=3)
        size += len(dumps_json(metadata))
    return size


def turn_end(
    turn_id: str,
    reason: AbortReason | None,
    *,
    last_text: str | None = None,
    unstarted: bool = False,
    inputs: Sequence[Event] = (),
    discarded: Sequence[Event] = (),
    partial: str = "",
    steering: Sequence[str] = (),
    error: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> list[Event]:
    """Return the events that end turn ``turn_id`` (``reason`` None: it completed).

    In order: ``TurnStarted`` when it never started, its input not yet journaled, a staged
    boundary's discard, the text streamed and not kept (an interrupted message), steering
    that reached no model call (kept: the next turn replays it), the error, then
    ``TurnComplete(last_text)`` or ``TurnAborted(reason)``. ``metadata``: the input's, for
    the ``TurnStarted`` of a turn that never started.
    """
    events: list[Event] = [TurnStarted(turn_id, metadata)] if unstarted else []
    events += [*inputs, *discarded]
    if partial:
        events.append(ItemCompleted(turn_id, AssistantMessage(partial, True)))
    events += [ItemCompleted(turn_id, UserMessage(text)) for text in steering]
    if error is not None:
        events.append(ErrorEvent(error, turn_id))
    end = TurnComplete(turn_id, last_text) if reason is None else TurnAborted(turn_id, reason)
    return [*events, end]
