"""Strict checks of wire shapes against the ``anthropic`` package's own types.

Requests are checked against the SDK's ``TypedDict`` request parameters (every key known,
every required key present, every value of its declared type); responses and stream events
are validated as the SDK's pydantic models, and a field the SDK does not know is refused
too. A fixture or a request body that drifts from the real wire format fails the test.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any

import pydantic
from anthropic.types.beta import (
    BetaMessage,
    BetaRawMessageStreamEvent,
    message_count_tokens_params,
    message_create_params,
)
from anthropic.types.beta_error_response import BetaErrorResponse
from typing_extensions import is_typeddict

_NONE = type(None)


class WireError(AssertionError):
    """Raised when a value does not match the SDK's type; the message gives the path."""


def _strip(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    while origin in (typing.Annotated,) or str(origin).endswith(("Required", "NotRequired")):
        tp = typing.get_args(tp)[0]
        origin = typing.get_origin(tp)
    return tp


def check_value(value: Any, tp: Any, path: str = "$") -> None:
    """Raise :class:`WireError` unless ``value`` is of the (SDK request) type ``tp``."""
    tp = _strip(tp)
    if tp is Any or tp is object:
        return
    if isinstance(tp, typing.TypeVar):
        return
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is _NONE or tp is None:
        if value is not None:
            raise WireError(f"{path}: expected null, got {value!r}")
        return
    if origin in (typing.Union, types.UnionType):
        return _check_union(value, args, path)
    if origin is typing.Literal:
        if value not in args:
            raise WireError(f"{path}: expected one of {args!r}, got {value!r}")
        return
    if is_typeddict(tp):
        return _check_typeddict(value, tp, path)
    if tp is str:
        if not isinstance(value, str):
            raise WireError(f"{path}: expected a string, got {value!r}")
        return
    if tp is bool:
        if not isinstance(value, bool):
            raise WireError(f"{path}: expected a boolean, got {value!r}")
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{path}: expected an integer, got {value!r}")
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"{path}: expected a number, got {value!r}")
        return
    if origin in (dict, collections.abc.Mapping) or tp in (dict, typing.Dict):  # noqa: UP006
        if not isinstance(value, dict):
            raise WireError(f"{path}: expected an object, got {value!r}")
        if len(args) == 2:
            for key, item in value.items():
                check_value(item, args[1], f"{path}.{key}")
        return
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence) or (
        getattr(origin, "__name__", "") == "SequenceNotStr"
        or getattr(tp, "__name__", "") == "SequenceNotStr"
    ):
        if not isinstance(value, list):
            raise WireError(f"{path}: expected an array, got {value!r}")
        for index, item in enumerate(value):
            check_value(item, args[0] if args else Any, f"{path}[{index}]")
        return
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise WireError(f"{path}: expected {tp.__name__}, got {value!r}")
        return
    raise WireError(f"{path}: cannot check against {tp!r}")


def _check_union(value: Any, options: tuple[Any, ...], path: str) -> None:
    stripped = [_strip(option) for option in options]
    if isinstance(value, dict) and "type" in value:
        # Discriminated unions of blocks: pick the member whose `type` literal matches.
        for option in stripped:
            if is_typeddict(option):
                hint = typing.get_type_hints(option, include_extras=True).get("type")
                literal = _strip(hint) if hint is not None else None
                if typing.get_origin(literal) is typing.Literal and value["type"] in (
                    typing.get_args(literal)
                ):
                    return _check_typeddict(value, option, path)
    errors = []
    for option in stripped:
        try:
            check_value(value, option, path)
            return
        except WireError as error:
            errors.append(str(error))
    raise WireError(f"{path}: matches no member of the union: {'; '.join(errors[:4])}")


def _check_typeddict(value: Any, tp: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise WireError(f"{path}: expected an object ({tp.__name__}), got {value!r}")
    hints = typing.get_type_hints(tp, include_extras=True)
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise WireError(f"{path}: {tp.__name__} has no field {unknown[0]!r}")
    missing = sorted(set(tp.__required_keys__) - set(value))
    if missing:
        raise WireError(f"{path}: {tp.__name__} needs {missing[0]!r}")
    for key, item in value.items():
        check_value(item, hints[key], f"{path}.{key}")


def check_request(body: Any, *, stream: bool) -> None:
    """Check a ``POST /v1/messages`` body against the SDK's (beta) request parameters."""
    params = (
        message_create_params.MessageCreateParamsStreaming
        if stream
        else message_create_params.MessageCreateParamsNonStreaming
    )
    check_value(body, params)


def check_count_tokens(body: Any) -> None:
    """Check a ``POST /v1/messages/count_tokens`` body."""
    check_value(body, message_count_tokens_params.MessageCountTokensParams)


def _no_extra(model: Any, path: str) -> None:
    if isinstance(model, pydantic.BaseModel):
        extra = model.__pydantic_extra__ or {}
        if extra:
            raise WireError(f"{path}: {type(model).__name__} has no field {sorted(extra)[0]!r}")
        for name in type(model).model_fields:
            _no_extra(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for index, item in enumerate(model):
            _no_extra(item, f"{path}[{index}]")


_EVENT = pydantic.TypeAdapter(BetaRawMessageStreamEvent)


def check_event(data: Any) -> None:
    """Check one streamed event (``message_start`` ... ``error``) against the SDK's models."""
    if isinstance(data, dict) and data.get("type") == "error":
        check_error(data)
        return
    if isinstance(data, dict) and data.get("type") == "ping":
        if set(data) != {"type"}:
            raise WireError(f"a ping event has only a type: {data!r}")
        return
    try:
        event = _EVENT.validate_python(data)
    except pydantic.ValidationError as error:
        raise WireError(f"not a stream event: {error}") from None
    _no_extra(event, "$")


def check_message(data: Any) -> None:
    """Check a non-streamed message answer."""
    try:
        message = BetaMessage.model_validate(data)
    except pydantic.ValidationError as error:
        raise WireError(f"not a message: {error}") from None
    _no_extra(message, "$")


def check_models(data: Any) -> None:
    """Check a ``GET /v1/models`` answer: a page of the SDK's ``ModelInfo`` entries."""
    from anthropic.types import ModelInfo

    if not isinstance(data, dict) or set(data) != {"data", "has_more", "first_id", "last_id"}:
        raise WireError(f"not a models page: {data!r}")
    for entry in data["data"]:
        try:
            info = ModelInfo.model_validate(entry)
        except pydantic.ValidationError as error:
            raise WireError(f"not a model: {error}") from None
        _no_extra(info, "$.data[]")


def check_error(data: Any) -> None:
    """Check an error body (HTTP error answer, or an ``error`` stream event)."""
    try:
        error = BetaErrorResponse.model_validate(data)
    except pydantic.ValidationError as exc:
        raise WireError(f"not an error body: {exc}") from None
    _no_extra(error, "$")
