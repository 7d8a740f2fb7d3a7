"""Roder's replay history as the ``messages=`` chain of simonw/llm.

The chain is built from Roder's journal, never from llm's log database: the model sees
exactly what replay gives (everything from the last compaction boundary on). The input of
the call being made (a trailing user message, or trailing tool results) is handed over
separately, as llm's ``prompt`` and ``tool_results``, so that plugins that read only those
(older ones) still see it, and llm folds it into the chain for those that read
``prompt.messages``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from roder_api.enginekit import SUMMARY_PREFIX, paired_tool_ids, split_at_boundary
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    Reasoning,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
)


@dataclass
class LlmHistory:
    """What one llm call is made of (llm's own objects, built by :func:`llm_history`)."""

    messages: list[Any] = field(default_factory=list)
    """The chain before this call's input: ``llm.parts.Message`` objects."""
    prompt: str | None = None
    """The trailing user message's text, when the call answers one."""
    tool_results: list[Any] = field(default_factory=list)
    """The trailing tool results (``llm.ToolResult``), when the call follows a tool step."""


def _arguments(raw: str) -> dict[str, Any]:
    """Return a call's JSON arguments as a mapping (llm keeps them parsed)."""
    try:
        value = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def llm_history(
    transcript: Sequence[TranscriptItem], instructions: str | None = None
) -> LlmHistory:
    """Return the llm chain, prompt and tool results for one call on ``transcript``.

    ``instructions`` open the chain as a system message (llm takes ``messages=`` as the
    whole history, its ``system=`` argument aside).
    A local summary boundary (``ContextCompaction``) becomes a user message, as every
    engine replays it; a provider's native boundary cannot be replayed to another provider
    and is left out (with only the items after it). Tool calls without a result and results
    without their call are left out (providers refuse unpaired ones).
    """
    from llm import ToolResult
    from llm.parts import Message, ReasoningPart, TextPart, ToolCallPart, ToolResultPart

    boundary, items = split_at_boundary(transcript)
    paired = paired_tool_ids(items)
    chain: list[Any] = []
    if instructions:
        chain.append(Message(role="system", parts=[TextPart(text=instructions)]))
    if isinstance(boundary, ContextCompaction):
        chain.append(Message(role="user", parts=[TextPart(text=SUMMARY_PREFIX + boundary.summary)]))

    def open_message(role: str) -> Any:
        if not chain or chain[-1].role != role:
            chain.append(Message(role=role, parts=[]))
        return chain[-1]

    for item in items:
        if isinstance(item, UserMessage):
            chain.append(Message(role="user", parts=[TextPart(text=item.text)]))
        elif isinstance(item, AssistantMessage):
            open_message("assistant").parts.append(TextPart(text=item.text))
        elif isinstance(item, Reasoning):
            open_message("assistant").parts.append(ReasoningPart(text=item.text))
        elif isinstance(item, ToolCallRecord) and item.id in paired:
            open_message("assistant").parts.append(
                ToolCallPart(
                    name=item.name, arguments=_arguments(item.arguments), tool_call_id=item.id
                )
            )
        elif isinstance(item, ToolResultRecord) and item.id in paired:
            open_message("tool").parts.append(
                ToolResultPart(name=item.name, output=item.result, tool_call_id=item.id)
            )

    history = LlmHistory()
    if chain and chain[-1].role == "user" and len(chain[-1].parts) == 1:
        history.prompt = chain.pop().parts[0].text
    elif chain and chain[-1].role == "tool":
        history.tool_results = [
            ToolResult(name=part.name, output=part.output, tool_call_id=part.tool_call_id)
            for part in chain.pop().parts
        ]
    history.messages = chain
    return history
