"""A minimal Roder engine plugin: echoes the last user message back, word by word."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from roder_api import hookimpl
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
    Usage,
)
from roder_api.transcript import UserMessage


class EchoEngine(InferenceEngine):
    """Answers ``echo: <last user message>``."""

    id = "echo"
    capabilities = InferenceCapabilities.text_only()

    async def list_models(self, ctx: InferenceProviderContext) -> Sequence[ModelDescriptor]:
        """Return the one model this engine has."""
        return [ModelDescriptor("echo-1", context_window=8192)]

    async def stream_turn(
        self, ctx: InferenceTurnContext, request: AgentInferenceRequest
    ) -> AsyncIterator[InferenceEvent]:
        """Yield the echo word by word, then usage and completion."""
        last = next(
            (i.text for i in reversed(request.transcript) if isinstance(i, UserMessage)), ""
        )
        reply = f"echo: {last}"
        for index, word in enumerate(reply.split(" ")):
            yield MessageDelta(word if index == 0 else " " + word)
        tokens = len(reply.split())
        yield Usage(
            TokenUsage(prompt_tokens=tokens, completion_tokens=tokens, total_tokens=2 * tokens)
        )
        yield Completed(stop_reason="stop")


@hookimpl
def register_inference_engines(register: Callable[[InferenceEngine], None]) -> None:
    """Register the echo engine."""
    register(EchoEngine())
