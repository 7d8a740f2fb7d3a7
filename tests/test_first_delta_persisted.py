"""A model step's first text is persisted before the engine's stream is read on.

Persist-before-deliver makes the first delta wait for its sync; an engine that sent much
at once (a burst of chunks in one read) would otherwise keep the event loop busy — and the
GIL from the thread that syncs — while the rest of the burst is worked through, and the
first delta would reach the client only after it (the OpenAI surface's time to first
delta). Later text is coalesced and persisted as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import AssistantContentDelta
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
)
from roder_api.testing import MemoryThreadStoreFactory, ScriptedEngine
from roder_runtime import Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


class Burst(ScriptedEngine):
    """Streams three deltas at once; notes what was persisted when it is asked for more."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime: Runtime | None = None
        self.persisted_then: list[list[str]] = []

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        for text in ("one ", "two ", "three"):
            yield MessageDelta(text)
            self.persisted_then.append(await self._persisted_text(ctx.thread_id))
        yield Completed("stop")

    async def _persisted_text(self, thread_id: str) -> list[str]:
        assert self.runtime is not None
        store = await self.runtime.store()
        entries = await store.read_events(thread_id)
        return [e.event.delta for e in entries if isinstance(e.event, AssistantContentDelta)]


async def test_the_first_delta_is_persisted_before_the_next_is_read() -> None:
    engine = Burst()
    builder = ExtensionRegistryBuilder().inference_engine(engine)
    builder.thread_store_factory(MemoryThreadStoreFactory())
    runtime = engine.runtime = Runtime(builder.build(), RuntimeConfig())
    try:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "go") == "one two three"
    finally:
        await runtime.aclose()
    assert engine.persisted_then[0] == ["one "]  # asked for "two " only once it was durable
