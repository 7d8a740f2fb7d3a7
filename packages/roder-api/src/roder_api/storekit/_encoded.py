"""``EncodedEvents``: a batch of events that carries the codec bytes already made for it.

The session's recorder encodes each event once, to count it against its byte budget; it
hands the batch down as :class:`EncodedEvents`, so a store that writes codec bytes
(every store built on :class:`~roder_api.storekit.BlockingThreadStore`) writes those bytes
instead of encoding the events again. To any other store it is a plain list of events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from roder_api.codec import dumps_each
from roder_api.events import Event


class EncodedEvents(list[Event]):
    """A list of events and, in ``payloads``, each event's ``roder_api.codec.dumps`` bytes.

    Use it as the list of events it is; a store that keeps codec bytes takes them from
    :func:`payloads_of`. Whoever builds one promises that ``payloads[i]`` is
    ``dumps(self[i])``: the value rule (``UnserializableEventError`` naming the path) was
    applied when those bytes were made.
    """

    __slots__ = ("payloads",)

    def __init__(self, events: Iterable[Event], payloads: Sequence[bytes]) -> None:
        super().__init__(events)
        if len(payloads) != len(self):
            raise ValueError(f"{len(payloads)} payloads for {len(self)} events")
        self.payloads: list[bytes] = list(payloads)


def payloads_of(events: Sequence[Event]) -> list[bytes]:
    """Return each event's codec bytes: the ones :class:`EncodedEvents` carries, or new ones.

    Raise ``UnserializableEventError`` naming the path when an event must be encoded here
    and the value rule refuses it.
    """
    if type(events) is EncodedEvents and len(events.payloads) == len(events):
        return events.payloads
    return dumps_each(events)  # a plain list (or one changed after its bytes were made)


__all__ = ["EncodedEvents", "payloads_of"]
