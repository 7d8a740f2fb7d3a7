"""Tools: what a model may call during a turn, and the ``tool`` decorator that makes one.

A :class:`Tool` has a ``name`` (``[A-Za-z0-9_-]{1,64}``, what the OpenAI and Anthropic APIs
accept), a ``description``, ``parameters`` (a JSON Schema object) and an async
:meth:`Tool.call` that receives the arguments already parsed from JSON and checked against
the schema. :func:`tool` makes a ``Tool`` from a plain function, its type hints and its
docstring. Tools are registered with the ``register_tools`` hook or
``ExtensionRegistryBuilder.tool``; the runtime runs them (see ``docs/tools.md``).

The schema is built with pydantic and the docstring read with docstring_parser; both are
imported only when :func:`tool` is used, so importing ``roder_api`` stays light.
"""

from __future__ import annotations

import enum
import inspect
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import anyio
import anyio.to_thread

from roder_api.inference import ToolSpec

TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a tool name must match, whole (the OpenAI and Anthropic APIs accept exactly this)."""

EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}
"""The parameters of a tool that takes no arguments."""


def check_tool_name(name: object) -> str:
    """Return ``name`` when it is a valid tool name; raise ``ValueError`` saying why not."""
    if not isinstance(name, str) or TOOL_NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(
            f"invalid tool name {name!r}: use 1 to 64 letters, digits, '_' or '-' "
            "(what the OpenAI and Anthropic APIs accept)"
        )
    return name


class ApprovalPolicy(str, enum.Enum):
    """Whether a tool's calls run at once (``auto``), wait for the user (``ask``) or never
    run (``deny``)."""

    AUTO = "auto"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool returns: text for the model, whether it is an error, data for displays."""

    text: str
    is_error: bool = False
    display_payload: Any = None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool gets with each call: where the call belongs and its plugin settings.

    A tool that cannot stop work it started when it is cancelled (a blocking function in a
    thread) calls :meth:`mark_abandoned` before it lets the cancellation through, so that
    the result says the work was abandoned and may still be running.
    """

    thread_id: str
    turn_id: str
    call_id: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    _abandoned: list[bool] = field(default_factory=list, repr=False, compare=False)

    def mark_abandoned(self) -> None:
        """Record that this call's work was left running when the call was cancelled."""
        self._abandoned.append(True)

    @property
    def abandoned(self) -> bool:
        """Return True when :meth:`mark_abandoned` was called for this call."""
        return bool(self._abandoned)


class Tool:
    """The base class of tools: set the attributes, implement :meth:`call`.

    ``idempotent``: running it twice for one call does no harm, so after a crash a call
    that started and never finished is run again (otherwise it gets an error result).
    ``timeout_s``: a deadline for one call (None: none of its own). ``requires_approval``:
    without a ``[tools.approval]`` entry, each call waits for the user's approval.
    """

    name: str = ""
    description: str = ""
    parameters: Mapping[str, Any] = EMPTY_PARAMETERS
    idempotent: bool = False
    timeout_s: float | None = None
    requires_approval: bool = False

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolOutput | str:
        """Run the tool with ``arguments`` (parsed JSON, valid for ``parameters``)."""
        raise NotImplementedError(f"tool {self.name!r} does not implement call()")

    def spec(self) -> ToolSpec:
        """Return what the engine is told about this tool."""
        return ToolSpec(self.name, self.description, dict(self.parameters))

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release the tool's resources (a server connection, ...); the default does nothing.

        Called by ``ExtensionRegistry.aclose``; it may be called more than once.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


F = TypeVar("F", bound=Callable[..., Any])


class FunctionTool(Tool):
    """A tool made from a plain function by :func:`tool` (sync functions run in a thread).

    A parameter annotated with :class:`ToolContext` receives the call's context and is not
    part of the schema. The return value becomes the text the model sees: a ``str`` as is,
    a :class:`ToolOutput` as given, anything else as JSON.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        idempotent: bool = False,
        timeout_s: float | None = None,
        requires_approval: bool = False,
    ) -> None:
        from roder_api._tool_schema import function_schema

        schema = function_schema(func, context_type=ToolContext)
        self.func = func
        self.name = check_tool_name(name if name is not None else func.__name__)
        self.description = description if description is not None else schema.description
        self.parameters = schema.parameters
        self.idempotent = idempotent
        self.timeout_s = timeout_s
        self.requires_approval = requires_approval
        self._context_parameter = schema.context_parameter
        self._validate = schema.validate
        self._is_async = inspect.iscoroutinefunction(func)

    async def call(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolOutput | str:
        """Call the function with the arguments converted to its annotated types."""
        kwargs = self._validate(arguments)
        if self._context_parameter is not None:
            kwargs[self._context_parameter] = ctx
        if self._is_async:
            value = await self.func(**kwargs)
        else:
            value = await _run_in_thread(ctx, self.func, kwargs)
        return _as_output(value)


async def _run_in_thread(ctx: ToolContext, func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a blocking function in a worker thread; on cancellation, abandon it if it runs on."""
    finished = threading.Event()

    def run() -> Any:
        try:
            return func(**kwargs)
        finally:
            finished.set()

    try:
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        if not finished.is_set():
            ctx.mark_abandoned()
        raise


def _as_output(value: Any) -> ToolOutput | str:
    if isinstance(value, (ToolOutput, str)):
        return value
    from roder_api._tool_schema import NotJsonDataError, to_json_text

    try:
        return to_json_text(value)
    except NotJsonDataError as exc:  # the function ran; what it returned cannot be sent
        return ToolOutput(str(exc), is_error=True)


@overload
def tool(func: F, /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    timeout_s: float | None = None,
    requires_approval: bool = False,
) -> Callable[[F], FunctionTool]: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    timeout_s: float | None = None,
    requires_approval: bool = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Return a :class:`Tool` made from ``func`` (use as ``@tool`` or ``@tool(...)``).

    The name defaults to the function's name, the description to its docstring's text, and
    the parameters' JSON Schema comes from the type hints, with each parameter's
    description taken from the docstring (Google, NumPy or reST style).
    """

    def make(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f,
            name=name,
            description=description,
            idempotent=idempotent,
            timeout_s=timeout_s,
            requires_approval=requires_approval,
        )

    if func is not None:
        return make(func)
    return make


def arguments_error(parameters: Mapping[str, Any], arguments: Any) -> str | None:
    """Return a one-line reason why ``arguments`` do not fit the JSON Schema ``parameters``.

    Return None when they fit. A schema that is itself invalid is reported as such.
    """
    from roder_api._tool_schema import schema_error

    return schema_error(parameters, arguments)


ToolCallable = Callable[[ToolContext, Mapping[str, Any]], Awaitable[ToolOutput | str]]
"""The shape of :meth:`Tool.call` as a plain callable."""


__all__ = [
    "ApprovalPolicy",
    "EMPTY_PARAMETERS",
    "FunctionTool",
    "TOOL_NAME_PATTERN",
    "Tool",
    "ToolCallable",
    "ToolContext",
    "ToolOutput",
    "arguments_error",
    "check_tool_name",
    "tool",
]
