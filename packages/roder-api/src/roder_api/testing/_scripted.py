"""The scripted engine: deterministic replies for demos, examples and tests."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio
import orjson

from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    MessageDelta,
    ModelDescriptor,
    TokenUsage,
    ToolCallCompleted,
    Usage,
)
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)


@dataclass(frozen=True, slots=True)
class Raise:
    """A script step: raise ``error`` at this point of the stream."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Hang:
    """A script step: block forever (until the stream is cancelled or closed)."""


@dataclass(frozen=True, slots=True)
class Delay:
    """A script step: sleep ``seconds`` before the next step."""

    seconds: float


ScriptStep: TypeAlias = InferenceEvent | Raise | Hang | Delay
"""One step of a script: an event to yield, or an action."""

Script: TypeAlias = Sequence[ScriptStep]
"""The steps of one model call."""

ScriptFunction: TypeAlias = Callable[[InferenceTurnContext, AgentInferenceRequest, int], Script]
"""Return the script of the ``n``-th call (from 0) for a context and request."""


def tool_call(name: str, arguments: Any = None, *, id: str | None = None) -> ToolCallCompleted:
    """Return a script step: the model calls tool ``name`` with ``arguments`` (as JSON).

    ``arguments`` is a mapping (dumped as JSON; None: ``{}``) or JSON text used as is (to
    script invalid JSON). ``id`` defaults to ``call_<name>``.
    """
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return ToolCallCompleted(id or f"call_{name}", name, text)


def estimate_tokens(text: str) -> int:
    """Return a rough token count of ``text`` (four characters a token, at least 1)."""
    return max(1, (len(text) + 3) // 4)


def item_text(item: TranscriptItem) -> str:
    """Return the text an item contributes to a prompt (for estimates and summaries)."""
    if isinstance(item, (UserMessage, AssistantMessage, Reasoning)):
        return item.text
    if isinstance(item, ToolCallRecord):
        return f"{item.name}({item.arguments})"
    if isinstance(item, ToolResultRecord):
        return item.result
    if isinstance(item, ContextCompaction):
        return item.summary
    return str(item.data)


class ScriptedEngine(InferenceEngine):
    """A deterministic engine: plays scripts, or answers ``You said: <last user text>``.

    By default it also calls tools: when the request offers tools and the last user message
    reads ``call NAME`` (optionally followed by JSON arguments, several calls separated by
    ``;``), it calls them; once their results are in, it answers with what they said.

    ``turns`` and ``compactions`` give the steps of successive ``stream_turn`` and
    ``compact_turn`` calls: a list of scripts (the last one repeats when ``repeat_last``)
    or a function of ``(ctx, request, call_index)``. When the scripts run out the engine
    answers by default: it streams ``You said: ...`` word by word with usage, and (with
    ``native_compaction``) compacts into a ``compaction`` item that keeps the user messages.
    Every request is recorded in ``requests`` / ``compaction_requests``; ``open_streams``
    counts generators not yet closed, ``closed_streams`` those closed. ``delta_delay``
    (seconds) paces the default reply's words, to watch it stream.
    """

    capabilities = InferenceCapabilities(streaming=True, tool_calls=True, reasoning=True)

    def __init__(
        self,
        *,
        id: str = "scripted",
        turns: Sequence[Script] | ScriptFunction | None = None,
        compactions: Sequence[Script] | ScriptFunction | None = None,
        native_compaction: bool = True,
        requires_native_compaction: bool = False,
        repeat_last: bool = False,
        context_window: int = 128_000,
        models: Sequence[str] = ("scripted-1",),
        delta_delay: float = 0.0,
    ) -> None:
        self.id = id
        self.requires_native_compaction = requires_native_compaction
        self._turns = turns
        self._compactions = compactions
        self._native = native_compaction or requires_native_compaction
        self._repeat_last = repeat_last
        self._context_window = context_window
        self._models = tuple(models)
        self._delta_delay = delta_delay
        self.requests: list[tuple[InferenceTurnContext, AgentInferenceRequest]] = []
        self.compaction_requests: list[tuple[InferenceTurnContext, AgentInferenceRequest]] = []
        self.open_streams = 0
        self.closed_streams = 0

    @property
    def supports_native_compaction(self) -> bool:
        """Return True unless built with ``native_compaction=False``."""
        return self._native

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the scripted models, each with the configured context window."""
        return tuple(ModelDescriptor(m, context_window=self._context_window) for m in self._models)

    def _script(
        self,
        source: Sequence[Script] | ScriptFunction | None,
        ctx: InferenceTurnContext,
        request: AgentInferenceRequest,
        index: int,
    ) -> Script | None:
        if source is None:
            return None
        if callable(source):
            return source(ctx, request, index)
        if index < len(source):
            return source[index]
        if self._repeat_last and source:
            return source[-1]
        return None

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the next turn script's events, or the default reply."""
        index = len(self.requests)
        self.requests.append((ctx, request))
        script = self._script(self._turns, ctx, request, index)
        if script is None:
            script = default_reply(request, delta_delay=self._delta_delay)
        # Close the inner generator as soon as ours is closed (an interrupt, a preemption).
        async with aclosing(self._play(script)) as events:
            async for event in events:
                yield event

    async def compact_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the next compaction script's events, or a default native compaction."""
        if not self._native:
            raise NotImplementedError(f"engine {self.id!r} has no native compaction")
        index = len(self.compaction_requests)
        self.compaction_requests.append((ctx, request))
        script = self._script(self._compactions, ctx, request, index)
        if script is None:
            script = default_compaction(request, index)
        # Close the inner generator as soon as ours is closed (an interrupt, a preemption).
        async with aclosing(self._play(script)) as events:
            async for event in events:
                yield event

    async def _play(self, script: Script) -> AsyncGenerator[InferenceEvent, None]:
        self.open_streams += 1
        try:
            for step in script:
                if isinstance(step, Raise):
                    raise step.error
                if isinstance(step, Hang):
                    await anyio.sleep_forever()
                elif isinstance(step, Delay):
                    await anyio.sleep(step.seconds)
                else:
                    yield step
        finally:
            self.open_streams -= 1
            self.closed_streams += 1


def _last_user_text(transcript: Sequence[TranscriptItem]) -> str:
    for item in reversed(transcript):
        if isinstance(item, UserMessage):
            return item.text
    return ""


_CALL = re.compile(r"^\s*call\s+([A-Za-z0-9_-]{1,64})\s*(.*?)\s*$", re.DOTALL)


def _requested_calls(request: AgentInferenceRequest) -> list[ToolCallCompleted] | None:
    """Return the calls ``call NAME ARGS; ...`` asks for, or None when the text asks none."""
    offered = {spec.name for spec in request.tools}
    if not offered:
        return None
    text = _last_user_text(request.transcript)
    calls: list[ToolCallCompleted] = []
    for index, part in enumerate(text.split(";")):
        match = _CALL.match(part)
        if match is None or match.group(1) not in offered:
            return None
        name, arguments = match.group(1), match.group(2) or "{}"
        calls.append(ToolCallCompleted(f"call_{index + 1}_{name}", name, arguments))
    return calls


def _results_since_last_user(transcript: Sequence[TranscriptItem]) -> list[ToolResultRecord]:
    results: list[ToolResultRecord] = []
    for item in reversed(transcript):
        if isinstance(item, UserMessage):
            break
        if isinstance(item, ToolResultRecord):
            results.append(item)
    return results[::-1]


def default_reply(request: AgentInferenceRequest, *, delta_delay: float = 0.0) -> list[ScriptStep]:
    """Return the default script: ``You said: <text>`` in word deltas, usage, completed.

    With tools offered and ``call NAME [JSON]`` as the last user text, the script calls the
    tools instead; after their results it says ``NAME said: RESULT`` for each.
    ``delta_delay`` seconds pass before each word after the first.
    """
    prompt = sum(estimate_tokens(item_text(i)) for i in request.transcript) or 1
    calls = _requested_calls(request)
    results = _results_since_last_user(request.transcript)
    if calls is not None and not results:
        return [*calls, Usage(TokenUsage(prompt, 5, prompt + 5)), Completed("tool_calls")]
    if calls is not None:
        reply = "; ".join(f"{r.name} said: {r.result}" for r in results)
    else:
        reply = f"You said: {_last_user_text(request.transcript)}"
    words = reply.split(" ")
    steps: list[ScriptStep] = []
    for i, word in enumerate(words):
        if i and delta_delay > 0:
            steps.append(Delay(delta_delay))
        steps.append(MessageDelta(word if i == 0 else " " + word))
    completion = estimate_tokens(reply)
    steps.append(Usage(TokenUsage(prompt, completion, prompt + completion)))
    steps.append(Completed(stop_reason="stop"))
    return steps


def default_compaction(request: AgentInferenceRequest, index: int) -> list[ScriptStep]:
    """Return a native compaction script: one ``compaction`` item that keeps user messages."""
    kept: list[dict[str, Any]] = []
    for item in request.transcript:
        if isinstance(item, UserMessage):
            kept.append({"type": "message", "role": "user", "content": item.text})
        elif isinstance(item, ProviderMetadata):
            for entry in item.data.get("compacted_input", ()) or ():
                if isinstance(entry, dict) and entry.get("role") == "user":
                    kept.append(entry)
    summary = " / ".join(item_text(i) for i in request.transcript)[:2000]
    compaction = {
        "type": "compaction",
        "id": f"cmp_scripted_{index + 1}",
        "encrypted_content": base64.b64encode(summary.encode()).decode("ascii"),
    }
    prompt = sum(estimate_tokens(item_text(i)) for i in request.transcript) or 1
    return [
        ProviderMetadata({"output": [compaction], "compacted_input": [*kept, compaction]}),
        Usage(TokenUsage(prompt, 10, prompt + 10)),
        Completed(stop_reason="compacted"),
    ]
