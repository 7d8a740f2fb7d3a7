"""What the event recorder holds: queued events' sizes and bytes, merged text, wake-ups.

The pieces of :class:`~roder_runtime.session._recorder.EventRecorder` that are plain data
or plain rules, kept apart so the recorder's module holds its logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from roder_api.codec import dumps
from roder_api.events import AssistantContentDelta, ContentPhase, Event
from roder_api.storekit import EncodedEvents

DELTA_OVERHEAD = 96
"""Bytes counted for a delta's envelope (type tag, ids, phase) on top of its text."""


StreamKey = tuple[str, str, ContentPhase]
"""What makes text deltas one stream: their turn, model step and phase."""


Queued = tuple[Event, int, bytes | None]
"""An event waiting to be persisted: the event, its size, its bytes (None: encoded later)."""

Measured = tuple[int, bytes | None]
"""An event's size against the byte budget and its codec bytes (None: encoded later)."""


def measure(event: Event) -> Measured:
    """Return the bytes an event is counted for against the byte budget, and its encoding.

    A text delta is counted by its text (it may still be merged with the next ones, so it
    is encoded when its batch is persisted); any other event is encoded here, once, and
    counted by its bytes. Raise ``UnserializableEventError`` naming the path when the
    value rule refuses the event.
    """
    if isinstance(event, AssistantContentDelta):
        size = (
            len(event.delta.encode("utf-8"))
            + len(event.turn_id)
            + len(event.model_step_id)
            + DELTA_OVERHEAD
        )
        return size, None
    payload = dumps(event)
    return len(payload), payload


def event_size(event: Event) -> int:
    """Return the bytes an event is counted for against the recorder's byte budget."""
    return measure(event)[0]


def encoded(queued: Sequence[Queued]) -> EncodedEvents:
    """Return queued events as one batch with their bytes (deltas encoded now, once)."""
    return EncodedEvents(
        (event for event, _, _ in queued),
        [payload if payload is not None else dumps(event) for event, _, payload in queued],
    )


@dataclass(slots=True)
class Pending:
    """Text deltas of one stream waiting to be merged into one event."""

    key: StreamKey
    parts: list[str]
    text_bytes: int
    size: int
    deadline: float

    def event(self) -> AssistantContentDelta:
        """Return the merged text as one delta."""
        turn_id, step_id, phase = self.key
        return AssistantContentDelta(turn_id, step_id, phase, "".join(self.parts))


class Signal:
    """A level-free wake-up: ``notify()`` wakes every task waiting at that moment."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        """Wake every task waiting now."""
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        """Wait for the next :meth:`notify`."""
        await self._event.wait()


@dataclass(slots=True)
class Counters:
    """Events and bytes held from acceptance until delivery."""

    count: int = 0
    size: int = 0
    queued: int = 0  # events given a place in the persist queue so far
    persisted: int = 0  # of those, persisted (or discarded after a failure)
    delivered: int = 0  # of those, taken by the consumer
