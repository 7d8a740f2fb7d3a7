"""The inference-engine conformance kit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

import anyio
import orjson
import pytest

from roder_api.codec import to_dict
from roder_api.inference import (
    INFERENCE_EVENT_TYPES,
    AgentInferenceRequest,
    Completed,
    Failed,
    InferenceCapabilities,
    InferenceEngine,
    InferenceEvent,
    InferenceProviderContext,
    InferenceTurnContext,
    MessageDelta,
    ModelDescriptor,
    ReasoningDelta,
    TokenUsage,
    ToolCallCompleted,
    ToolSpec,
    Usage,
)
from roder_api.testing._kit_support import backends
from roder_api.transcript import (
    ProviderMetadata,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)


class InferenceEngineConformance:
    """The engine conformance kit: subclass it and override ``inference_engine``.

    The checks call the engine the way the runtime does and check the shape of what it
    yields. Override :meth:`make_request` when the engine needs a particular model or
    transcript to answer (for example against a loopback test server).
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    model: ClassVar[str] = ""
    """The model id to request; empty: the first model ``list_models`` offers, else
    ``default``."""

    tools: ClassVar[tuple[ToolSpec, ...]] = (
        ToolSpec(
            "get_time",
            "Return the current time in a time zone.",
            {
                "type": "object",
                "properties": {"zone": {"type": "string", "description": "an IANA zone"}},
                "required": ["zone"],
            },
        ),
    )
    """The tools offered in the tool round trip."""

    tool_prompt: ClassVar[str] = 'call get_time {"zone": "UTC"}'
    """The user message of the tool round trip: it asks the model to call a tool."""

    @pytest.fixture(params=backends())
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """Run every check under asyncio and trio."""
        return str(request.param)

    @pytest.fixture
    def inference_engine(self) -> InferenceEngine:
        """Return the engine under test (override this fixture)."""
        raise NotImplementedError("override the `inference_engine` fixture to return your engine")

    async def make_request(
        self, engine: InferenceEngine, text: str = "Hello, engine!"
    ) -> AgentInferenceRequest:
        """Return the request the checks send (a single user message)."""
        model = self.model
        if not model:
            models = await engine.list_models(InferenceProviderContext())
            model = models[0].id if models else "default"
        return AgentInferenceRequest(model, None, [UserMessage(text)])

    @staticmethod
    def context(purpose: str = "turn") -> InferenceTurnContext:
        """Return the context the checks pass."""
        return InferenceTurnContext("conformance", "turn-1", "step-1", purpose, 1)

    async def _collect(self, stream: AsyncIterator[InferenceEvent]) -> list[InferenceEvent]:
        events: list[InferenceEvent] = []
        try:
            async for event in stream:
                events.append(event)
        finally:
            await _aclose(stream)
        return events

    async def test_identity(self, inference_engine: InferenceEngine) -> None:
        """The engine has an id, capabilities, and lists its models."""
        engine = inference_engine
        assert isinstance(engine, InferenceEngine)
        assert isinstance(engine.id, str) and engine.id, "set the engine's `id`"
        assert isinstance(engine.capabilities, InferenceCapabilities)
        models = await engine.list_models(InferenceProviderContext())
        for model in models:
            assert isinstance(model, ModelDescriptor) and model.id
        if engine.requires_native_compaction:
            assert engine.supports_native_compaction, (
                "requires_native_compaction is set but compact_turn is not overridden"
            )

    async def test_stream_turn_shape(self, inference_engine: InferenceEngine) -> None:
        """``stream_turn`` yields engine events and ends with exactly one Completed/Failed."""
        engine = inference_engine
        request = await self.make_request(engine)
        events = await self._collect(engine.stream_turn(self.context(), request))
        _check_stream(events, engine)
        assert isinstance(events[-1], Completed), f"the turn did not complete: {events[-1]!r}"

    async def test_stream_turn_can_be_closed_early(self, inference_engine: InferenceEngine) -> None:
        """Closing the stream after its first event is clean, and the engine still works."""
        engine = inference_engine
        request = await self.make_request(engine)
        stream = engine.stream_turn(self.context(), request)
        first = await stream.__anext__()
        assert isinstance(first, INFERENCE_EVENT_TYPES)
        await _aclose(stream)
        events = await self._collect(engine.stream_turn(self.context(), request))
        _check_stream(events, engine)

    async def test_concurrent_streams(self, inference_engine: InferenceEngine) -> None:
        """Several turns may stream from one engine at once."""
        engine = inference_engine
        results: list[list[InferenceEvent]] = []

        async def one(index: int) -> None:
            request = await self.make_request(engine, f"Hello number {index}")
            results.append(await self._collect(engine.stream_turn(self.context(), request)))

        async with anyio.create_task_group() as tg:
            for index in range(4):
                tg.start_soon(one, index)
        assert len(results) == 4
        for events in results:
            _check_stream(events, engine)

    async def test_compact_turn_shape(self, inference_engine: InferenceEngine) -> None:
        """A native compaction yields exactly one boundary, no tool call, then Completed."""
        engine = inference_engine
        if not engine.supports_native_compaction:
            pytest.skip(f"engine {engine.id!r} has no native compaction")
        request = await self.make_request(engine, "Please compact this conversation.")
        events = await self._collect(engine.compact_turn(self.context("compaction"), request))
        _check_stream(events, engine)
        assert isinstance(events[-1], Completed), f"the compaction failed: {events[-1]!r}"
        boundaries = [
            e for e in events if isinstance(e, ProviderMetadata) and is_compaction_boundary(e)
        ]
        assert len(boundaries) == 1, "a native compaction must yield exactly one boundary"
        assert not any(isinstance(e, ToolCallCompleted) for e in events)

    async def test_tool_round_trip(self, inference_engine: InferenceEngine) -> None:
        """Offered tools and asked to, the engine calls one; given the results, it answers."""
        engine = inference_engine
        if not engine.capabilities.tool_calls:
            pytest.skip(f"engine {engine.id!r} does not call tools")
        base = await self.make_request(engine, self.tool_prompt)
        request = AgentInferenceRequest(
            base.model, base.instructions, base.transcript, self.tools, base.metadata
        )
        events = await self._collect(engine.stream_turn(self.context(), request))
        _check_stream(events, engine)
        assert isinstance(events[-1], Completed), f"the turn did not complete: {events[-1]!r}"
        calls = [e for e in events if isinstance(e, ToolCallCompleted)]
        assert calls, "asked to call a tool, the engine called none"
        offered = {spec.name for spec in self.tools}
        assert {c.name for c in calls} <= offered, f"called a tool not offered: {calls!r}"
        assert len({c.id for c in calls}) == len(calls), "tool call ids must be unique"
        history: list[TranscriptItem] = list(request.transcript)
        for event in events:
            if isinstance(event, ProviderMetadata):
                history.append(event)
            elif isinstance(event, ToolCallCompleted):
                history.append(ToolCallRecord(event.id, event.name, event.arguments))
        history += [ToolResultRecord(c.id, c.name, f"{c.name} answered: 12:00") for c in calls]
        follow_up = AgentInferenceRequest(
            request.model, request.instructions, history, self.tools, request.metadata
        )
        second = await self._collect(engine.stream_turn(self.context(), follow_up))
        _check_stream(second, engine)
        assert isinstance(second[-1], Completed), f"the follow-up failed: {second[-1]!r}"

    async def test_aclose(self, inference_engine: InferenceEngine) -> None:
        """``aclose`` (and ``async with``) release the engine without error."""
        async with inference_engine as engine:
            assert engine is inference_engine


async def _aclose(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _check_stream(events: Sequence[object], engine: InferenceEngine) -> None:
    """Assert the shape of one engine stream."""
    assert events, "the stream yielded nothing"
    for event in events:
        assert isinstance(event, INFERENCE_EVENT_TYPES), f"not an engine event: {event!r}"
    terminal = [e for e in events if isinstance(e, (Completed, Failed))]
    assert len(terminal) == 1, f"expected one Completed or Failed, got {terminal!r}"
    assert events[-1] is terminal[0], "Completed/Failed must be the last event"
    for event in events:
        if isinstance(event, (MessageDelta, ReasoningDelta)):
            assert isinstance(event.text, str)
        elif isinstance(event, ToolCallCompleted):
            assert engine.capabilities.tool_calls, "tool call from an engine without tool calls"
            assert event.id and event.name, "a tool call needs an id and a name"
            orjson.loads(event.arguments)
        elif isinstance(event, Usage):
            usage = event.usage
            assert isinstance(usage, TokenUsage)
            counts = to_dict(usage)
            assert all(v >= 0 for k, v in counts.items() if k != "type"), usage
            assert usage.prompt_tokens >= usage.cached_prompt_tokens, (
                "prompt_tokens must include the cached prompt tokens"
            )
            assert usage.prompt_tokens >= usage.cache_creation_prompt_tokens
        elif isinstance(event, ProviderMetadata):
            orjson.dumps(to_dict(event))
        elif isinstance(event, Failed):
            assert isinstance(event.message, str) and event.message


__all__ = ["InferenceEngineConformance"]
