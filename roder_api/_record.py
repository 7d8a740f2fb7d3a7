"""The base of every persisted value type and the type-tag registry behind ``roder_api.codec``."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

_REGISTRY: dict[str, type[Record]] = {}

Decoder = Callable[[Any], Any]


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
        return cls

    return decorate


def encode_value(value: Any) -> Any:
    """Return ``value`` as plain JSON data (records become tagged dicts, enums their value)."""
    if isinstance(value, Record):
        return to_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: encode_value(v) for k, v in value.items()}
    return value


def to_dict(obj: Record) -> dict[str, Any]:
    """Return the tagged dict of a persisted object."""
    cls = type(obj)
    if not cls.TYPE:
        raise TypeError(f"{cls.__name__} is not a registered Roder record type")
    out: dict[str, Any] = {"type": cls.TYPE}
    for name in cls._codec_fields:
        out[name] = encode_value(getattr(obj, name))
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
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise ValueError(f"unknown record type {tag!r}")
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
        raise ValueError(f"bad {tag!r} record: {exc}") from None


def record_types() -> Mapping[str, type[Record]]:
    """Return the registered record classes by type tag."""
    return dict(_REGISTRY)
