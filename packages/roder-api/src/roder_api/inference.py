"""Inference: the engine base class, the events an engine yields, and provider failures."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from roder_api._record import Record, register
from roder_api.errors import RoderError
from roder_api.transcript import ProviderMetadata, TranscriptItem


@register("token_usage")
@dataclass(frozen=True, slots=True)
class TokenUsage(Record):
    """Tokens used by one or more model calls; ``a + b`` adds them field by field.

    ``prompt_tokens`` includes ``cached_prompt_tokens`` and ``cache_creation_prompt_tokens``
    (they are subsets, as in the OpenAI and Anthropic APIs); ``completion_tokens`` includes
    ``reasoning_tokens`` (the part the model spent reasoning, where the provider says so:
    OpenAI's ``reasoning_tokens``; 0 when it does not, and in journals written before it
    was recorded).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_prompt_tokens: int = 0
    cache_creation_prompt_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: object) -> TokenUsage:
        if not isinstance(other, TokenUsage):
            return NotImplemented
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            cache_creation_prompt_tokens=(
                self.cache_creation_prompt_tokens + other.cache_creation_prompt_tokens
            ),
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    def is_zero(self) -> bool:
        """Return True when no tokens are counted."""
        return not (
            self.prompt_tokens
            or self.completion_tokens
            or self.total_tokens
            or self.cached_prompt_tokens
            or self.cache_creation_prompt_tokens
            or self.reasoning_tokens
        )


# --- events an engine yields -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageDelta:
    """A piece of the assistant's final-answer text."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the model's reasoning (summary) text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallCompleted:
    """A complete tool call; ``arguments`` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage observed for this call (may come more than once; they add up)."""

    usage: TokenUsage


@dataclass(frozen=True, slots=True)
class Completed:
    """The stream ended cleanly."""

    stop_reason: str | None = None
    provider_response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider reported that the call failed; the stream ends here."""

    message: str


InferenceEvent: TypeAlias = (
    MessageDelta
    | ReasoningDelta
    | ToolCallCompleted
    | Usage
    | ProviderMetadata
    | Completed
    | Failed
)
"""Any event an engine's ``stream_turn`` or ``compact_turn`` yields."""

INFERENCE_EVENT_TYPES: tuple[type, ...] = (
    MessageDelta,
    ReasoningDelta,
    ToolCallCompleted,
    Usage,
    ProviderMetadata,
    Completed,
    Failed,
)
"""The classes of :data:`InferenceEvent`, for ``isinstance`` checks."""


# --- failures -----------------------------------------------------------------------------


class ProviderFailureKind(str, enum.Enum):
    """Why a provider call failed; ``retryable`` says whether trying again may help."""

    STREAM_INTERRUPTED = "stream_interrupted"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    NETWORK = "network"
    AUTHENTICATION = "authentication"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_WINDOW_EXCEEDED = "context_window_exceeded"
    CONTENT_FILTERED = "content_filtered"
    OTHER = "other"

    @property
    def retryable(self) -> bool:
        """Return True for transient kinds that a retry may cure."""
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {
        ProviderFailureKind.STREAM_INTERRUPTED,
        ProviderFailureKind.RATE_LIMITED,
        ProviderFailureKind.OVERLOADED,
        ProviderFailureKind.TIMEOUT,
        ProviderFailureKind.NETWORK,
    }
)


class ProviderFailure(RoderError):  # noqa: N818 - the contract's name
    """Raised by an engine when a provider call fails, possibly mid-stream.

    ``retry_after`` (seconds) is the provider's hint for when to try again.
    """

    def __init__(
        self, kind: ProviderFailureKind, message: str, retry_after: float | None = None
    ) -> None:
        self.kind = ProviderFailureKind(kind)
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"{self.kind.value}: {message}")

    @property
    def retryable(self) -> bool:
        """Return True when the failure is of a retryable kind."""
        return self.kind.retryable


# --- requests and descriptions ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferenceCapabilities:
    """What an engine can do."""

    streaming: bool = True
    tool_calls: bool = False
    reasoning: bool = False
    images: bool = False

    @classmethod
    def text_only(cls) -> InferenceCapabilities:
        """Return the capabilities of an engine that streams text and nothing else."""
        return cls(streaming=True, tool_calls=False, reasoning=False, images=False)


@dataclass(frozen=True, slots=True)
class ModelDescriptor:
    """A model an engine offers; ``context_window`` is in tokens when known."""

    id: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    display_name: str | None = None


@dataclass(frozen=True, slots=True)
class ModelSelection:
    """An engine id and a model id."""

    provider: str
    model: str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: a name, a description and a JSON-schema of parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentInferenceRequest:
    """One model call: the model, the instructions, the replay transcript and the tools.

    ``max_output_tokens``: the most tokens the call may answer with (a summarising
    compaction's cap), or None for the engine's configured default. An engine sends it as
    the provider's output cap (``max_tokens``, ``max_output_tokens``), the lower of it and
    its own configured cap.
    """

    model: str
    instructions: str | None
    transcript: Sequence[TranscriptItem]
    tools: Sequence[ToolSpec] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    max_output_tokens: int | None = None

    def output_cap(self, configured: int | None) -> int | None:
        """Return the output cap to send: the lower of ``configured`` (the engine's own
        setting, None: none) and :attr:`max_output_tokens` (None when neither is set)."""
        caps = [cap for cap in (configured, self.max_output_tokens) if cap]
        return min(caps) if caps else None


@dataclass(frozen=True, slots=True)
class InferenceProviderContext:
    """What an engine gets for calls outside a turn (``list_models``)."""

    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferenceTurnContext:
    """What an engine gets for one model call: where it belongs and why it is made.

    ``purpose`` is ``turn`` or ``compaction``; ``attempt`` counts retries from 1.
    """

    thread_id: str
    turn_id: str
    model_step_id: str = ""
    purpose: str = "turn"
    attempt: int = 1


# --- the request-sent hint -----------------------------------------------------------------

_REQUEST_SENT: ContextVar[Callable[[], object] | None] = ContextVar(
    "roder_request_sent", default=None
)


def request_sent() -> None:
    """Say that the running model call's request is on the wire (optional, cheap).

    An engine calls it once its request is written, before it waits for the answer
    (``roder_api.enginekit.httpx_client.HttpxClient`` does so for every request it sends).
    The runtime holds back blocking work that would compete with the request for the
    interpreter until then (a new thread's create, ``Runtime.start_session(create=True)``),
    or until the call's first event, its end, or a short deadline. Outside a model call it
    does nothing; calling it again does nothing more.
    """
    callback = _REQUEST_SENT.get()
    if callback is not None:
        callback()


@contextmanager
def on_request_sent(callback: Callable[[], object] | None) -> Iterator[None]:
    """Call ``callback`` (on the event loop) each time the code run inside, in this task
    or the tasks it starts, calls :func:`request_sent` (None: nothing is called there): the
    runtime's side of the hint."""
    token = _REQUEST_SENT.set(callback)
    try:
        yield
    finally:
        _REQUEST_SENT.reset(token)


# --- the engine base class ------------------------------------------------------------------


class InferenceEngine:
    """The base class of inference engines (model providers).

    Subclasses set ``id`` and ``capabilities`` (class attributes are fine), implement
    ``list_models`` and the async generator method ``stream_turn``, and override
    ``compact_turn`` only when the provider compacts natively. Both generators yield
    :data:`InferenceEvent` values and may raise :class:`ProviderFailure` mid-stream. The
    runtime closes a generator (``aclose``) as soon as it no longer wants its events.
    """

    id: str = ""
    capabilities: InferenceCapabilities = InferenceCapabilities.text_only()
    requires_native_compaction: bool = False
    default_model: str | None = None
    """The model used when neither the caller nor ``default_model`` in the configuration
    chooses one (None: the runtime passes ``<engine id>-default`` and the engine decides)."""
    engine_type: str | None = None
    """The ``type`` an ``[engines.<id>]`` table names to make another engine of this kind
    with the table's id (None: no table makes one). The runtime lists the types the
    installed engines declare when a table names one that does not exist."""

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the models this engine offers."""
        return ()

    def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the events of one model call for ``request``."""
        raise NotImplementedError(f"engine {self.id!r} does not implement stream_turn")

    def compact_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield a native compaction of ``request.transcript``: a boundary, usage, ``Completed``.

        Engines without native compaction do not override this.
        """
        raise NotImplementedError(f"engine {self.id!r} has no native compaction")

    @property
    def supports_native_compaction(self) -> bool:
        """Return True when this engine overrides ``compact_turn``."""
        return type(self).compact_turn is not InferenceEngine.compact_turn

    async def aclose(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release the engine's resources (HTTP clients, ...); the default does nothing."""

    async def __aenter__(self) -> InferenceEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


__all__ = [
    "AgentInferenceRequest",
    "Completed",
    "Failed",
    "INFERENCE_EVENT_TYPES",
    "InferenceCapabilities",
    "InferenceEngine",
    "InferenceEvent",
    "InferenceProviderContext",
    "InferenceTurnContext",
    "MessageDelta",
    "ModelDescriptor",
    "ModelSelection",
    "ProviderFailure",
    "ProviderFailureKind",
    "ProviderMetadata",
    "ReasoningDelta",
    "TokenUsage",
    "ToolCallCompleted",
    "ToolSpec",
    "Usage",
    "on_request_sent",
    "request_sent",
]
