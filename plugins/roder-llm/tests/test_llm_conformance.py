"""The ``llm`` engine, driving the real ``llm-echo`` plugin, against the engine kit."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from roder_api.inference import InferenceEngine
from roder_api.testing import InferenceEngineConformance
from roder_llm import LlmEngine, LlmSettings


class TestLlmEchoConformance(InferenceEngineConformance):
    """``llm`` with llm-echo's ``echo`` model (streams, usage, tool calls on request)."""

    model: ClassVar[str] = "echo"
    # llm-echo calls the tools its prompt names, as JSON: the kit's tool round trip asks it to.
    tool_prompt: ClassVar[str] = json.dumps(
        {"prompt": "What time is it?", "tool_calls": [{"name": "get_time", "arguments": {}}]}
    )

    @pytest.fixture
    def inference_engine(self) -> InferenceEngine:
        return LlmEngine(LlmSettings())
