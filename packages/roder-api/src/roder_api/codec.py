"""JSON codec for every persisted type: tagged dicts and JSON bytes.

``to_dict(obj)`` / ``from_dict(data)`` dispatch on the ``type`` tag; ``dumps`` / ``loads`` add
JSON. Fields unknown to this version are kept on the object (``unknown_fields``) and written
back, so data from a newer version survives a round trip.

**The value rule** (the same for every store): whatever the standard library's ``json``
round-trips in an event round-trips through the codec — lone surrogates in text
(``"\\ud800"``), integers of any size, nesting up to :data:`MAX_NESTING` levels. Anything
else (a Python object, bytes, a set, NaN or an infinity, a non-text dict key, deeper
nesting, a container holding itself) raises ``UnserializableEventError`` naming the path to
the value (``item.data.rows[3]``), before a store writes anything.

orjson writes and reads every ordinary value (the fast path). orjson refuses lone
surrogates, integers beyond 64 bits and nesting past 254 levels, and it reads integers
beyond 64 bits back as floats; for values like those the codec writes with the standard
library instead, as ASCII JSON that starts with one space (:data:`EXACT_MARK`).
:func:`loads_json` reads bytes that start with the mark with the standard library and
everything else with orjson, so the fast path costs nothing extra. A store that embeds the
codec's bytes inside a JSON document of its own starts that document with the mark too
when any embedded part starts with it.
"""

from __future__ import annotations

import enum
import gc
import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import orjson

# Importing the type modules registers their tags.
import roder_api._thread_contract
import roder_api.events
import roder_api.inference
import roder_api.transcript  # noqa: F401
from roder_api._record import (
    Record,
    from_dict,
    record_builder,
    record_decoders,
    record_types,
    to_dict,
)
from roder_api.errors import StoreCorruptedError, UnserializableEventError
from roder_api.events import JournalEvent

MAX_NESTING = 256
"""The deepest an event may nest, in JSON levels (the event's own object is level 1)."""

FRAMING_LEVELS = 8
"""How many JSON levels a store's own document may wrap around a value (:func:`dumps_json`)."""

EXACT_MARK = b" "
"""The first byte of JSON the codec wrote with the standard library (see the module doc)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_exact_decoder = json.JSONDecoder(parse_constant=_refuse_constant)
_exact_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _segment(key: object) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f".{key}"
    return f"[{key!r}]"


def _path(parts: tuple[object, ...]) -> str:
    text = "".join(_segment(part) for part in parts)
    return text[1:] if text.startswith(".") else text or "(the value itself)"


def find_unserializable(
    value: Any, *, depth: int = 1, limit: int = MAX_NESTING
) -> tuple[str, str] | None:
    """Return ``(path, reason)`` of the first value the codec cannot carry, or None.

    ``value`` may hold records and enums (as persisted objects do) or plain JSON data;
    ``depth`` is the JSON level ``value`` itself sits at, ``limit`` the deepest level allowed.
    Walks without recursion, so even absurd nesting is reported rather than overflowing the
    stack.
    """
    stack: list[tuple[Any, int, tuple[object, ...]]] = [(value, depth, ())]
    while stack:
        current, level, parts = stack.pop()
        if isinstance(current, enum.Enum):
            current = current.value
        if current is None or isinstance(current, (bool, int, str)):
            continue
        if isinstance(current, float):
            if not math.isfinite(current):
                return _path(parts), f"{current!r} is not a JSON number"
            continue
        if level > limit:
            return _path(parts), (
                f"nested deeper than {limit} levels (or a container holds itself)"
            )
        if isinstance(current, Record):
            cls = type(current)
            if not cls.TYPE:
                return _path(parts), f"{cls.__name__} is not a registered Roder record type"
            for name in reversed(cls._codec_fields):
                stack.append((getattr(current, name), level + 1, (*parts, name)))
            for key, item in current.unknown_fields.items():
                stack.append((item, level + 1, (*parts, key)))
        elif isinstance(current, Mapping):
            for key, item in reversed(list(current.items())):
                if not isinstance(key, str):
                    return _path((*parts, key)), (
                        f"the key {key!r} is a {type(key).__name__}; JSON keys are text"
                    )
                stack.append((item, level + 1, (*parts, key)))
        elif isinstance(current, (list, tuple)):
            for index in range(len(current) - 1, -1, -1):
                stack.append((current[index], level + 1, (*parts, index)))
        else:
            return _path(parts), f"a {type(current).__name__} is not JSON data"
    return None


def _unserializable(
    obj: object, exc: BaseException, *, batch: bool, index: int = 0
) -> UnserializableEventError:
    problem = find_unserializable(obj)
    what = f"event {index} of this batch" if batch else type(obj).__name__
    if problem is None:
        detail = str(exc) or type(exc).__name__
    else:
        path, reason = problem
        detail = f"{path}: {reason}"
    tail = "; nothing was stored" if batch else "; events must hold JSON data only"
    return UnserializableEventError(f"cannot serialise {what}: {detail}{tail}")


def _exact(data: Any) -> bytes:
    return EXACT_MARK + _exact_encoder.encode(data).encode("ascii")


def _encode(obj: Record, *, batch: bool = False, index: int = 0) -> tuple[Any, bytes | None]:
    """Return ``(to_dict(obj), its orjson bytes or None when only the exact path can)``."""
    try:
        data = to_dict(obj)
    except (TypeError, AttributeError) as exc:
        raise _unserializable(obj, exc, batch=batch, index=index) from exc
    try:
        return data, orjson.dumps(data)
    except TypeError as exc:
        if find_unserializable(obj) is not None:
            raise _unserializable(obj, exc, batch=batch, index=index) from exc
        return data, None


def dumps(obj: Record) -> bytes:
    """Return the JSON bytes of a persisted object (orjson's, or the exact path's).

    Raise ``UnserializableEventError`` naming the path when a field holds something the
    value rule refuses.
    """
    data, fast = _encode(obj)
    return fast if fast is not None else _exact(data)


def check_value(value: Any, *, what: str = "the value", depth: int = 1) -> None:
    """Raise ``UnserializableEventError`` naming the path when the value rule refuses ``value``.

    ``depth`` is the JSON level ``value`` sits at in the document it is stored in (a thread's
    metadata object is level 1, its ``extra`` level 2). Walks the whole value: for checks
    at the edge of an API (a metadata change), not for every event.
    """
    problem = find_unserializable(value, depth=depth)
    if problem is not None:
        path, reason = problem
        raise UnserializableEventError(
            f"cannot serialise {what}: {path}: {reason}; nothing was stored"
        )


def dumps_json(value: Any) -> bytes:
    """Return the JSON bytes of plain JSON data (for example a store's own record).

    For data the codec produced or :func:`check_value` passed: orjson's bytes, or the exact
    path's for values orjson cannot write. The store's document may wrap the checked value
    in up to :data:`FRAMING_LEVELS` levels of its own. Raise ``UnserializableEventError`` naming the
    path when the value rule refuses ``value`` (NaN is refused earlier, by ``to_dict`` and
    :func:`check_value`: orjson writes it as null without complaint).
    """
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        problem = find_unserializable(value, limit=MAX_NESTING + FRAMING_LEVELS)
        if problem is not None:
            path, reason = problem
            raise UnserializableEventError(
                f"cannot serialise {path}: {reason}; nothing was stored"
            ) from exc
    return _exact(value)


def dumps_each(objs: Sequence[Record]) -> list[bytes]:
    """Return the JSON bytes of each object of a batch (for stores that keep one per row).

    Raise ``UnserializableEventError`` (nothing of the batch is usable) when one cannot be
    serialised.
    """
    try:
        return [orjson.dumps(to_dict(obj)) for obj in objs]
    except (TypeError, AttributeError):
        pass
    out: list[bytes] = []
    for index, obj in enumerate(objs):
        data, fast = _encode(obj, batch=True, index=index)
        out.append(fast if fast is not None else _exact(data))
    return out


def dumps_list(objs: Sequence[Record]) -> bytes:
    """Return a batch as the JSON bytes of one JSON array of tagged objects.

    The bytes start with :data:`EXACT_MARK` when the batch needed the exact path. Raise
    ``UnserializableEventError`` when one cannot be serialised.
    """
    try:
        return orjson.dumps([to_dict(obj) for obj in objs])
    except (TypeError, AttributeError):
        pass
    datas = [_encode(obj, batch=True, index=index)[0] for index, obj in enumerate(objs)]
    return _exact(datas)


def loads_json(data: bytes | str) -> Any:
    """Return the plain JSON data of bytes this codec wrote (either path).

    Raise ``orjson.JSONDecodeError`` (a ``json.JSONDecodeError``) when they are not JSON.
    """
    # data[0] rather than data[:1]: no new object per call on the hot path.
    if not data or data[0] not in _MARKS:
        return orjson.loads(data)
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    try:
        return _exact_decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise orjson.JSONDecodeError(exc.msg, exc.doc, exc.pos) from None
    except (ValueError, RecursionError) as exc:
        raise orjson.JSONDecodeError(str(exc) or "nested too deeply", text, 0) from None


_MARKS = (EXACT_MARK[0], EXACT_MARK.decode())
_build_journal_event = record_builder(JournalEvent)


def journal_event(sequence: int, recorded_at_ms: int, event: Any) -> JournalEvent:
    """Return ``JournalEvent(sequence, recorded_at_ms, event)`` built without the constructor.

    For a store's read loop, where the parts are already decoded: it fills the slots as the
    constructor would, with the shared empty ``unknown_fields``.
    """
    built: JournalEvent = _build_journal_event(sequence, recorded_at_ms, event)
    return built


def journal_event_builder() -> Callable[[int, int, Any], JournalEvent]:
    """Return the function behind :func:`journal_event`, for a store's read loop to bind.

    Calling it saves a call per event; the result is the same record.
    """
    build: Callable[[int, int, Any], JournalEvent] = _build_journal_event
    return build


def event_decoders() -> Mapping[str, Callable[[Mapping[str, Any]], Any]]:
    """Return the live table of decoders by type tag that :func:`from_dict` dispatches on.

    For a store's read loop: ``decoders[data["type"]](data)`` is ``from_dict(data)`` for a
    well-formed tagged dict (unknown fields are kept the same way); on ``KeyError`` or
    ``TypeError`` call :func:`from_dict`, which raises the codec's own ``ValueError``.
    """
    return record_decoders()


def journal_events(
    rows: Iterable[tuple[Any, Any, bytes | str]], *, thread_id: str | None = None
) -> list[JournalEvent]:
    """Return the journal events of ``(sequence, recorded_at_ms, event JSON)`` rows.

    The fast path of a store's bulk read: each event is decoded with :func:`loads_json` and
    :func:`from_dict`, the ``JournalEvent`` is built without its constructor's checks, and
    the cyclic collector is paused meanwhile (:func:`gc_paused`). A row that does not
    decode (not JSON, not a Roder record) raises ``StoreCorruptedError`` naming
    ``thread_id`` and the row's sequence.
    """
    make, parse, marks, decoders = _build_journal_event, orjson.loads, _MARKS, record_decoders()
    out: list[JournalEvent] = []
    append = out.append
    seq: Any = None
    with gc_paused():
        # One try around the loop: free while nothing fails (a try per row is not).
        try:
            for seq, at, raw in rows:
                # loads_json and from_dict, inlined: this loop runs once per event of a thread.
                data = parse(raw) if raw and raw[0] not in marks else loads_json(raw)
                try:
                    event = decoders[data["type"]](data)
                except (KeyError, TypeError):
                    event = from_dict(data)  # raises the codec's own error for a bad record
                append(make(int(seq), int(at), event))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise _damaged_row(thread_id, seq, exc) from None
    return out


def _damaged_row(thread_id: str | None, sequence: Any, exc: Exception) -> StoreCorruptedError:
    """Return the error for a stored event row that does not decode (``exc`` says why)."""
    where = f"thread {thread_id!r}" if thread_id is not None else "a thread"
    number = sequence if isinstance(sequence, int) else None
    return StoreCorruptedError(
        f"{where} is damaged: the event at sequence {sequence} is not a Roder record "
        f"({exc}); nothing was changed",
        thread_id=thread_id,
        sequence=number,
    )


class _GcPause:
    """Who holds :func:`gc_paused`, and whether the collector was running when they came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.disabled_by_us = False


_GC_PAUSE = _GcPause()


@cache
def _freeze_is_cheap() -> bool:
    """Whether ``gc.freeze`` and ``gc.unfreeze`` only move lists (O(1)): with the GIL; the
    free-threaded build walks the whole heap for each. Asked on first use (``sysconfig``
    is not imported at start-up)."""
    import sysconfig

    return not sysconfig.get_config_var("Py_GIL_DISABLED")


_PROMOTE_AFTER = 20_000
"""The young count past which :func:`gc_paused` moves the young generations to the oldest."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while many records are decoded.

    Decoding a long journal allocates a few objects per event, none of them in a cycle;
    the collector would run again and again over the whole heap meanwhile (measured: half
    of a 50,000-item ``load_thread``). Reference counting still frees everything. Safe
    across threads and tasks: the collector resumes when the last holder leaves, and it is
    left alone when the application had turned it off itself.

    On resuming, the young generations (mostly what was allocated meanwhile) join the
    oldest at once (``gc.freeze`` then ``gc.unfreeze``, which also resets the young count)
    instead of being walked by a young-generation pass on the next allocation (measured:
    ~9 ms after a 50,000-item load, over objects that are kept, or freed by reference
    counting). Cycles among them are still found, by the next full collection. Only after
    a large decode (``_PROMOTE_AFTER`` objects in the young count: a small replay before a
    turn leaves the young generation to its usual pass, so that short-lived cycles of a
    long-running process are not kept until a full collection). Skipped when the
    application keeps objects frozen itself, so as not to thaw them, and on the
    free-threaded build (where both walk the heap).
    """
    pause = _GC_PAUSE
    with pause.lock:
        if pause.holders == 0 and gc.isenabled():
            gc.disable()
            pause.disabled_by_us = True
        pause.holders += 1
    try:
        yield
    finally:
        with pause.lock:
            pause.holders -= 1
            if pause.holders == 0 and pause.disabled_by_us:
                pause.disabled_by_us = False
                if (
                    gc.get_count()[0] >= _PROMOTE_AFTER
                    and not gc.get_freeze_count()
                    and _freeze_is_cheap()
                ):
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()


def loads(data: bytes | str) -> Any:
    """Return the object serialised in ``data`` (the inverse of :func:`dumps`)."""
    return from_dict(loads_json(data))


__all__ = [
    "EXACT_MARK",
    "FRAMING_LEVELS",
    "MAX_NESTING",
    "check_value",
    "dumps",
    "dumps_each",
    "dumps_json",
    "dumps_list",
    "event_decoders",
    "find_unserializable",
    "from_dict",
    "gc_paused",
    "journal_event",
    "journal_event_builder",
    "journal_events",
    "loads",
    "loads_json",
    "record_types",
    "to_dict",
]
