"""Roder engines for OpenAI-style APIs.

- ``openai`` (:class:`OpenAIResponsesEngine`): the Responses API, streamed, with native
  compaction (``/responses/compact``) and reasoning replayed exactly under ``store: false``.
- ``openai-chat`` (:class:`OpenAIChatEngine`): Chat Completions, for local servers.

Both take :class:`EngineSettings` (from an ``[engines.<id>]`` table) and an optional httpx
``transport`` for tests.
"""

from __future__ import annotations

# The engine kit's names, still importable from here (their home is roder_api.enginekit).
from roder_api.enginekit import ServerSentEvent as ServerSentEvent
from roder_api.enginekit import SSEDecoder as SSEDecoder
from roder_api.enginekit import aiter_sse as aiter_sse
from roder_openai._chat import ChatStreamState, OpenAIChatEngine, chat_usage
from roder_openai._http import failure_for_status, retry_after_seconds
from roder_openai._http import redact as redact  # roder_api.enginekit.redact
from roder_openai._replay import chat_messages, responses_input
from roder_openai._responses import (
    HANDLED_EVENTS,
    OpenAIResponsesEngine,
    ResponsesStreamState,
    responses_usage,
)
from roder_openai._settings import (
    DEFAULT_API_KEY_ENV,
    OPENAI_BASE_URL,
    EngineSettings,
    OpenAISettingsError,
)

__version__ = "0.1.0"

__all__ = [
    "ChatStreamState",
    "DEFAULT_API_KEY_ENV",
    "EngineSettings",
    "HANDLED_EVENTS",
    "OPENAI_BASE_URL",
    "OpenAIChatEngine",
    "OpenAIResponsesEngine",
    "OpenAISettingsError",
    "ResponsesStreamState",
    "__version__",
    "chat_messages",
    "chat_usage",
    "failure_for_status",
    "responses_input",
    "responses_usage",
    "retry_after_seconds",
]
