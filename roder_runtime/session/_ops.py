"""The ops a session takes: user input, interrupting or steering a turn, approving a tool call."""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from roder_api.inference import ToolSpec
from roder_api.transcript import ToolResultRecord
from roder_runtime.tools._tool_step import ApproveToolCall


@dataclass(frozen=True, slots=True)
class UserInput:
    """An op: start a turn with ``text`` as the user's message (queued behind running turns).

    ``client_tools``: tools this turn offers that the caller runs (docs/tools.md, "Client
    tools"): a call to one ends the turn, left open for the caller. ``tool_results``: the
    caller's outputs for such open calls (``ToolResultRecord(call_id, name, output)``; the
    name is taken from the call), journaled before the turn's model step; with results,
    an empty ``text`` adds no user message. ``instructions``: the system instructions of
    this turn's model calls, in place of the configured ``instructions`` (None: those);
    kept by the session that accepts the input, not journaled. ``metadata``: JSON data the
    caller attaches to the turn, journaled once with its input, on the turn's first event
    (``TurnStarted.metadata``, or ``InputAccepted.metadata`` when the input waits), never
    interpreted; it counts towards ``max_input_bytes``.
    """

    text: str
    client_tools: tuple[ToolSpec, ...] = ()
    tool_results: tuple[ToolResultRecord, ...] = ()
    instructions: str | None = None
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Interrupt:
    """An op: stop turn ``turn_id`` now, keeping the text already delivered."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class Steer:
    """An op: new user input for the running turn; it preempts a running compaction.

    The running turn finishes its current model call, then adds ``text`` as a user message
    of the same turn and calls the model again. With no turn running — or when the running
    turn has already decided to end — it starts a turn, like :class:`UserInput`.
    """

    text: str


Op: TypeAlias = UserInput | Interrupt | Steer | ApproveToolCall
"""What :meth:`Session.submit` takes."""


class _Closable(Protocol):
    async def aclose(self) -> None: ...


S = TypeVar("S", bound=_Closable)


class SessionStart(Awaitable[S], Generic[S]):
    """What ``Runtime.start_session`` returns: await it, or use it as ``async with``.

    ``session = await runtime.start_session(...)`` starts the session (close it with
    ``aclose()``); ``async with runtime.start_session(...) as session:`` also closes it.
    """

    def __init__(self, starting: Coroutine[Any, Any, S]) -> None:
        self._starting = starting
        self._session: S | None = None

    def __await__(self) -> Generator[Any, None, S]:
        return self._starting.__await__()

    async def __aenter__(self) -> S:
        self._session = await self._starting
        return self._session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.aclose()
