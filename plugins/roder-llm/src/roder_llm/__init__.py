"""A Roder engine for every model simonw/llm's plugins reach.

``llm`` (:class:`LlmEngine`): streams from llm's async models (sync models from a worker
thread), replays the conversation from Roder's journal, maps tools both ways where the
model supports them, maps usage to ``TokenUsage`` and failures to Roder's typed ones. Keys
come from llm's own key store and environment variables; Roder never copies them.
"""

from __future__ import annotations

from roder_llm._engine import ENGINE_ID, LlmEngine, token_usage
from roder_llm._failures import llm_failure
from roder_llm._history import LlmHistory, llm_history
from roder_llm._settings import DEFAULT_TIMEOUT_S, LlmSettings, LlmSettingsError

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENGINE_ID",
    "LlmEngine",
    "LlmHistory",
    "LlmSettings",
    "LlmSettingsError",
    "__version__",
    "llm_failure",
    "llm_history",
    "token_usage",
]
