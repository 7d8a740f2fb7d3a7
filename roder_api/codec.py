"""JSON codec for every persisted type: tagged dicts and orjson bytes.

``to_dict(obj)`` / ``from_dict(data)`` dispatch on the ``type`` tag; ``dumps`` / ``loads`` add
orjson. Fields unknown to this version are kept on the object (``unknown_fields``) and written
back, so data from a newer version survives a round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

# Importing the type modules registers their tags.
import roder_api.events
import roder_api.inference
import roder_api.threads
import roder_api.transcript  # noqa: F401
from roder_api._record import Record, from_dict, record_types, to_dict
from roder_api.errors import UnserializableEventError


def dumps(obj: Record) -> bytes:
    """Return the orjson bytes of a persisted object.

    Raise ``UnserializableEventError`` when a field holds something JSON cannot carry.
    """
    try:
        return orjson.dumps(to_dict(obj))
    except TypeError as exc:
        raise UnserializableEventError(
            f"cannot serialise {type(obj).__name__}: {exc}; events must hold JSON data only"
        ) from exc


def _batch_error(exc: Exception) -> UnserializableEventError:
    return UnserializableEventError(
        f"cannot serialise an event of this batch: {exc}; nothing was stored"
    )


def dumps_each(objs: Sequence[Record]) -> list[bytes]:
    """Return the orjson bytes of each object of a batch (for stores that keep one per row).

    Raise ``UnserializableEventError`` (nothing of the batch is usable) when one cannot be
    serialised.
    """
    try:
        return [orjson.dumps(to_dict(obj)) for obj in objs]
    except (TypeError, AttributeError) as exc:
        raise _batch_error(exc) from exc


def dumps_list(objs: Sequence[Record]) -> bytes:
    """Return a batch as the orjson bytes of one JSON array of tagged objects.

    Raise ``UnserializableEventError`` when one cannot be serialised.
    """
    try:
        return orjson.dumps([to_dict(obj) for obj in objs])
    except (TypeError, AttributeError) as exc:
        raise _batch_error(exc) from exc


def loads(data: bytes | str) -> Any:
    """Return the object serialised in ``data`` (the inverse of :func:`dumps`)."""
    return from_dict(orjson.loads(data))


__all__ = ["dumps", "dumps_each", "dumps_list", "from_dict", "loads", "record_types", "to_dict"]
