"""Roder engines for OpenAI-style APIs.

- ``openai`` (:class:`OpenAIResponsesEngine`): the Responses API, streamed, with native
  compaction (``/responses/compact``) and reasoning replayed exactly under ``store: false``.
- ``openai-chat`` (:class:`OpenAIChatEngine`): Chat Completions, for local servers.

Both take :class:`EngineSettings` (from an ``[engines.<id>]`` table) and an optional httpx
``transport`` for tests.
"""

from __future__ import annotations

from roder_api.enginekit import ServerSentEvent, SSEDecoder, aiter_sse
from roder_openai._chat import ChatStreamState, OpenAIChatEngine, chat_usage
from roder_openai._http import failure_for_status, redact, retry_after_seconds
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
    "SSEDecoder",
    "ServerSentEvent",
    "__version__",
    "aiter_sse",
    "chat_messages",
    "chat_usage",
    "failure_for_status",
    "redact",
    "responses_input",
    "responses_usage",
    "retry_after_seconds",
]
