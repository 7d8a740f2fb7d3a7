"""The base of every persisted value type and the type-tag registry behind ``roder_api.codec``."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

_REGISTRY: dict[str, type[Record]] = {}
_DECODERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {}

Decoder = Callable[[Any], Any]


class _NoUnknownFields(dict[str, Any]):
    """The one empty ``unknown_fields`` shared by every decoded record that has none.

    A dict (so it compares, prints and pickles like the ``{}`` a constructor gives) that
    refuses changes: records are frozen, and a shared mapping must stay empty. Sharing it
    saves an empty dict per record: a quarter of the memory of a loaded journal.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a record's unknown_fields cannot be changed (records are frozen)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, ())


NO_UNKNOWN_FIELDS: Mapping[str, Any] = _NoUnknownFields()
"""The shared, empty ``unknown_fields`` of decoded records."""


@dataclass(frozen=True, slots=True)
class Record:
    """The base class of every persisted shape.

    Each subclass carries a ``type`` tag (``TYPE``) and keeps the fields it does not know
    (written by a newer version) in ``unknown_fields`` so that they survive a round trip.
    """

    TYPE: ClassVar[str] = ""
    _codec_fields: ClassVar[tuple[str, ...]] = ()
    _decoders: ClassVar[Mapping[str, Decoder]] = {}

    unknown_fields: Mapping[str, Any] = field(
        default_factory=dict, kw_only=True, repr=False, hash=False
    )


R = TypeVar("R", bound=type[Record])


def register(tag: str, **decoders: Decoder) -> Callable[[R], R]:
    """Register a record class under its ``type`` tag, with decoders for nested fields."""

    def decorate(cls: R) -> R:
        if tag in _REGISTRY:
            raise ValueError(f"type tag {tag!r} is already registered to {_REGISTRY[tag]!r}")
        cls.TYPE = tag
        cls._codec_fields = tuple(f.name for f in fields(cls) if f.name != "unknown_fields")
        cls._decoders = decoders
        _REGISTRY[tag] = cls
        _DECODERS[tag] = _compile_decoder(cls)
        return cls

    return decorate


_SCALARS = frozenset((str, int, bool, type(None)))


def encode_value(value: Any) -> Any:
    """Return ``value`` as plain JSON data (records become tagged dicts, enums their value)."""
    cls = type(value)
    if cls in _SCALARS:
        return value
    if cls is float:
        if not math.isfinite(value):
            # orjson would quietly write null: the value would change on the way back.
            raise TypeError(f"{value!r} is not a JSON number (NaN and infinities cannot be stored)")
        return value
    if isinstance(value, Record):
        return to_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    # Plain loops rather than comprehensions: one stack frame per nesting level, so the
    # codec's nesting limit is reached long before Python's recursion limit.
    if isinstance(value, (list, tuple)):
        items: list[Any] = []
        for item in value:
            items.append(encode_value(item))
        return items
    if isinstance(value, Mapping):
        mapping: dict[Any, Any] = {}
        for key, item in value.items():
            mapping[key] = encode_value(item)
        return mapping
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"{value!r} is not a JSON number (NaN and infinities cannot be stored)")
    return value


def to_dict(obj: Record) -> dict[str, Any]:
    """Return the tagged dict of a persisted object."""
    cls = type(obj)
    if not cls.TYPE:
        raise TypeError(f"{cls.__name__} is not a registered Roder record type")
    out: dict[str, Any] = {"type": cls.TYPE}
    for name in cls._codec_fields:
        try:
            out[name] = encode_value(getattr(obj, name))
        except RecursionError:
            # A container that holds itself, or absurd nesting: not JSON data.
            raise TypeError(
                f"{cls.__name__}.{name} is nested too deeply or contains itself"
            ) from None
    if obj.unknown_fields:
        for key, value in obj.unknown_fields.items():
            out.setdefault(key, value)
    return out


def from_dict(data: Mapping[str, Any]) -> Any:
    """Return the object a tagged dict describes; unknown fields are kept."""
    try:
        tag = data["type"]
    except (KeyError, TypeError):
        raise ValueError(f"not a tagged Roder record (no 'type' key): {data!r:.200}") from None
    try:
        decode = _DECODERS[tag]
    except (KeyError, TypeError):
        raise ValueError(f"unknown record type {tag!r}") from None
    return decode(data)


def _decode_general(cls: type[Record], data: Mapping[str, Any]) -> Any:
    """Return ``cls`` built from ``data`` through its constructor (defaults, unknown fields)."""
    known = cls._codec_fields
    decoders = cls._decoders
    kwargs: dict[str, Any] = {}
    unknown: dict[str, Any] | None = None
    for key, value in data.items():
        if key == "type":
            continue
        if key in known:
            decoder = decoders.get(key)
            kwargs[key] = decoder(value) if decoder is not None else value
        else:
            if unknown is None:
                unknown = {}
            unknown[key] = value
    if unknown:
        kwargs["unknown_fields"] = unknown
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"bad {cls.TYPE!r} record: {exc}") from None


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    for klass in cls.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None:
            setter: Callable[[Any, Any], None] = descriptor.__set__
            return setter
    raise TypeError(f"{cls.__name__} has no slot {name!r}")  # pragma: no cover - by construction


def _compile_decoder(cls: type[Record]) -> Callable[[Mapping[str, Any]], Any]:
    """Return a decoder for ``cls`` with a fast path for the common shape.

    Decoding dominates loading a journal, and a frozen dataclass's ``__init__`` assigns every
    field through ``object.__setattr__``. When a dict holds exactly the known fields (what
    this version writes), the fast path fills the slots directly, which is what ``__init__``
    would do (the records have no ``__post_init__``); any other shape (defaults missing,
    unknown fields from a newer version, bad data) takes the constructor path, so the
    result and the errors are the same as before.
    """
    names = cls._codec_fields
    if "__post_init__" in dir(cls) or not all(isinstance(n, str) for n in names):
        return lambda data: _decode_general(cls, data)  # pragma: no cover - none today
    namespace: dict[str, Any] = {
        "_cls": cls,
        "_new": object.__new__,
        "_general": _decode_general,
        "_set_unknown": _slot_setter(cls, "unknown_fields"),
        "_NO_UNKNOWN": NO_UNKNOWN_FIELDS,
        "_DECODERS": _DECODERS,
    }
    lines = [
        "def decode(data):",
        f"    if len(data) != {len(names) + 1}:",
        "        return _general(_cls, data)",
        "    try:",
    ]
    for index, name in enumerate(names):
        lines.append(f"        v{index} = data[{name!r}]")
    lines += ["    except KeyError:", "        return _general(_cls, data)"]
    for index, name in enumerate(names):
        namespace[f"_set{index}"] = _slot_setter(cls, name)
        decoder = cls._decoders.get(name)
        if decoder is from_dict:
            # A nested record: dispatch on its tag here, saving a call per level.
            lines.append("    try:")
            lines.append(f"        v{index} = _DECODERS[v{index}['type']](v{index})")
            lines.append("    except (KeyError, TypeError, ValueError):")
            lines.append("        return _general(_cls, data)")
        elif decoder is not None:
            namespace[f"_dec{index}"] = decoder
            lines.append("    try:")
            lines.append(f"        v{index} = _dec{index}(v{index})")
            lines.append("    except (TypeError, ValueError):")
            lines.append("        return _general(_cls, data)")
    lines.append("    obj = _new(_cls)")
    for index in range(len(names)):
        lines.append(f"    _set{index}(obj, v{index})")
    lines += ["    _set_unknown(obj, _NO_UNKNOWN)", "    return obj"]
    # Generated like dataclasses' own __init__: one straight-line function per class.
    exec("\n".join(lines), namespace)  # noqa: S102 - source built above from field names
    decode: Callable[[Mapping[str, Any]], Any] = namespace["decode"]
    return decode


def record_builder(cls: type[Record]) -> Callable[..., Any]:
    """Return a fast positional constructor of ``cls``: its codec fields in order, no checks.

    For readers that build many records from trusted parts (a journal event from the
    sequence, time and event a store decoded): it fills the slots as ``__init__`` would,
    with ``unknown_fields`` empty. Falls back to the class itself when that is not possible.
    """
    names = cls._codec_fields
    if "__post_init__" in dir(cls) or not names:
        return cls  # pragma: no cover - none today
    setters = [_slot_setter(cls, name) for name in names]
    set_unknown = _slot_setter(cls, "unknown_fields")
    new = object.__new__
    if len(setters) == 3:
        first, second, third = setters

        def build3(a: Any, b: Any, c: Any) -> Any:
            obj = new(cls)
            first(obj, a)
            second(obj, b)
            third(obj, c)
            set_unknown(obj, NO_UNKNOWN_FIELDS)
            return obj

        return build3

    def build(*values: Any) -> Any:
        obj = new(cls)
        for setter, value in zip(setters, values, strict=True):
            setter(obj, value)
        set_unknown(obj, NO_UNKNOWN_FIELDS)
        return obj

    return build


def record_decoders() -> Mapping[str, Callable[[Mapping[str, Any]], Any]]:
    """Return the live table of decoders by type tag (what :func:`from_dict` dispatches on)."""
    return _DECODERS


def record_types() -> Mapping[str, type[Record]]:
    """Return the registered record classes by type tag."""
    return dict(_REGISTRY)
