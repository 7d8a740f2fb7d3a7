"""JSON Schemas for tools: built from a function's signature, checked against arguments.

Imported only when a tool is made with ``roder_api.tools.tool`` or arguments are checked,
so that pydantic, jsonschema and docstring_parser load only on that path. pydantic builds
the schema (and converts arguments to the annotated types); jsonschema checks arguments
against any tool's schema, including schemas that plugins write by hand.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, get_args, get_type_hints

import orjson

try:
    import docstring_parser
    import jsonschema
    import pydantic
    import pydantic_core
    import referencing.exceptions  # jsonschema's own dependency: its $ref resolution
except ModuleNotFoundError as missing:  # roder-api alone: the extra is not installed
    raise ModuleNotFoundError(
        f"making or checking a tool needs {missing.name}, which roder-api installs as an "
        "extra: pip install 'roder-api[tools]'",
        name=missing.name,
    ) from missing

from roder_api.codec import find_unserializable


@dataclass(frozen=True, slots=True)
class FunctionSchema:
    """What :func:`function_schema` found out about a function."""

    description: str
    parameters: Mapping[str, Any]
    context_parameter: str | None
    validate: Callable[[Mapping[str, Any]], dict[str, Any]]


def function_schema(func: Callable[..., Any], *, context_type: type) -> FunctionSchema:
    """Return the description, the parameters' JSON Schema and an argument converter.

    A parameter annotated with ``context_type`` (``ToolContext``: passed in, as ``tools``
    imports this module) receives the context and is left out of the schema.
    """
    ToolContext = context_type  # noqa: N806 - the class it stands for

    signature = inspect.signature(func)
    try:
        hints = get_type_hints(func)
    except Exception as exc:  # noqa: BLE001 - any failure to resolve hints is the same error
        raise TypeError(f"cannot read the type hints of {func.__qualname__}: {exc}") from exc
    doc = docstring_parser.parse(inspect.getdoc(func) or "")
    described = {p.arg_name: (p.description or "") for p in doc.params}
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"{func.__qualname__}: *args and **kwargs cannot be tool parameters; "
                "name each parameter"
            )
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext or ToolContext in get_args(annotation):
            context_parameter = param.name
            continue
        default = ... if param.default is param.empty else param.default
        info = pydantic.Field(default, description=described.get(param.name) or None)
        fields[param.name] = (annotation, info)
    model = pydantic.create_model(
        f"{func.__name__}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    parameters = _clean(model.model_json_schema())
    parameters.setdefault("properties", {})
    description = "\n\n".join(
        part for part in (doc.short_description, doc.long_description) if part
    ).strip()

    def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
        parsed = model.model_validate(dict(arguments))
        return {name: getattr(parsed, name) for name in fields}

    return FunctionSchema(description, parameters, context_parameter, validate)


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: they repeat the names and cost the model tokens."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    for definition in schema.get("$defs", {}).values():
        if isinstance(definition, dict):
            _clean(definition)
    return schema


@functools.lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> jsonschema.protocols.Validator:
    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def schema_error(schema: Mapping[str, Any], arguments: Any) -> str | None:
    """Return a one-line reason why ``arguments`` break ``schema``, or None when they fit."""
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    except jsonschema.SchemaError as exc:
        return f"the tool's own schema is invalid: {exc.message}"
    except TypeError as exc:  # orjson's JSONEncodeError: a non-text key, a Python object
        return f"the tool's own schema is invalid: it is not JSON data ({exc})"
    except Exception as exc:  # noqa: BLE001 - a failure to build the validator is the schema's
        return f"the tool's own schema is invalid: {type(exc).__name__}: {exc}"
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except referencing.exceptions.Unresolvable as exc:
        return f"the tool's own schema is invalid: its $ref {exc.ref!r} cannot be resolved"
    except RecursionError:
        return (
            "the arguments could not be checked against the tool's schema: they nest too "
            "deep for the validator"
        )
    except Exception as exc:  # noqa: BLE001 - a schema may break the validator in any way
        return (
            "the arguments could not be checked against the tool's schema: "
            f"{type(exc).__name__}: {exc}"
        )
    if error is None:
        return None
    where = error.json_path if error.path else ""
    return f"{error.message} (at {where})" if where else error.message


class NotJsonDataError(ValueError):
    """Raised by :func:`to_json_text` for a value JSON cannot hold (NaN, a bytes key, ...)."""


def to_json_text(value: Any) -> str:
    """Return a tool's non-text return value as JSON text.

    Integers of any size are written exactly (orjson stops at 64 bits); a value JSON cannot
    hold raises :class:`NotJsonDataError` naming where it is (orjson would write NaN as
    null without a word).
    """
    data = pydantic_core.to_jsonable_python(value)
    problem = find_unserializable(data)
    if problem is not None:
        path, reason = problem
        raise NotJsonDataError(f"the tool returned a value that is not JSON data: {path}: {reason}")
    try:
        return orjson.dumps(data).decode()
    except TypeError:  # beyond orjson (an integer over 64 bits, a lone surrogate)
        return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
