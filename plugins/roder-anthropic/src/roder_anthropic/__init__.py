"""The Roder engine for the Anthropic Messages API.

``anthropic`` (:class:`AnthropicEngine`): streamed turns over httpx, extended thinking
replayed with its signatures, tool use, prompt-cache usage, typed failures, and Anthropic's
native compaction (in-turn through ``context_management``, standalone through the
``compaction`` parameter). It takes :class:`AnthropicSettings` (from an
``[engines.anthropic]`` table) and an optional httpx ``transport`` for tests.
"""

from __future__ import annotations

from roder_anthropic._engine import (
    IN_TURN_COMPACTION_BETA,
    STANDALONE_COMPACTION_BETA,
    AnthropicEngine,
    anthropic_tool,
)
from roder_anthropic._errors import failure_for_status, retry_after_seconds
from roder_anthropic._errors import redact as redact  # roder_api.enginekit.redact
from roder_anthropic._replay import anthropic_messages
from roder_anthropic._settings import (
    ANTHROPIC_BASE_URL,
    ANTHROPIC_VERSION,
    DEFAULT_API_KEY_ENV,
    DEFAULT_MODEL,
    AnthropicSettings,
    AnthropicSettingsError,
)
from roder_anthropic._stream import HANDLED_EVENTS, MessageStreamState, anthropic_usage

# The engine kit's names, still importable from here (their home is roder_api.enginekit).
from roder_api.enginekit import ServerSentEvent as ServerSentEvent
from roder_api.enginekit import SSEDecoder as SSEDecoder
from roder_api.enginekit import aiter_sse as aiter_sse

__version__ = "0.1.0"

__all__ = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_VERSION",
    "AnthropicEngine",
    "AnthropicSettings",
    "AnthropicSettingsError",
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_MODEL",
    "HANDLED_EVENTS",
    "IN_TURN_COMPACTION_BETA",
    "MessageStreamState",
    "STANDALONE_COMPACTION_BETA",
    "__version__",
    "anthropic_messages",
    "anthropic_tool",
    "anthropic_usage",
    "failure_for_status",
    "retry_after_seconds",
]
