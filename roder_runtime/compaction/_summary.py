"""Summarising compaction's prompt and boundary, for engines without native compaction."""

from __future__ import annotations

from collections.abc import Sequence

from roder_api.transcript import (
    ContextCompaction,
    ToolCallRecord,
    ToolResultRecord,
    TranscriptItem,
    UserMessage,
    is_compaction_boundary,
)
from roder_runtime.compaction._estimates import estimate_item_tokens, estimate_transcript_tokens

SUMMARY_INSTRUCTIONS = (
    "You are compacting a long conversation so that it can continue in a fresh context "
    "window. Write a concise summary of the conversation above that keeps: the user's goal "
    "(their first request), their latest message, the decisions made, the facts and tool "
    "results that still matter, and the work that is still open. Do not call tools. Reply "
    "with the summary only."
)
"""The instructions of a summarising compaction call."""

SUMMARY_REQUEST = "Summarise the conversation so far for its continuation, as instructed."
"""The user message that ends a summarising compaction prompt."""

GOAL_PREFIX = "User's goal: "
LATEST_PREFIX = "Latest user message: "


# --- summarising compaction -------------------------------------------------------------------


def _units(items: Sequence[TranscriptItem]) -> list[list[TranscriptItem]]:
    """Return ``items`` cut into units that never separate a tool call from its result.

    A tool call without a later result (or a result without an earlier call) is left out:
    a provider rejects an orphan, and dropping one half of a pair would orphan the other.
    """
    answered: set[str] = set()
    results_after: set[str] = set()
    for item in reversed(items):
        if isinstance(item, ToolResultRecord):
            results_after.add(item.id)
        elif isinstance(item, ToolCallRecord) and item.id in results_after:
            answered.add(item.id)
    units: list[list[TranscriptItem]] = []
    current: list[TranscriptItem] = []
    open_calls: set[str] = set()
    for item in items:
        if isinstance(item, ToolCallRecord):
            if item.id not in answered or item.id in open_calls:
                continue
            open_calls.add(item.id)
            answered.discard(item.id)
        elif isinstance(item, ToolResultRecord):
            if item.id not in open_calls:
                continue
            open_calls.discard(item.id)
        current.append(item)
        if not open_calls:
            units.append(current)
            current = []
    if current:  # unreachable for well-formed input; kept whole rather than split
        units.append(current)
    return units


def _carried_goal(items: Sequence[TranscriptItem]) -> str | None:
    """Return the user's goal: the one an earlier summary kept, or the first user message."""
    for item in items:
        if isinstance(item, UserMessage):
            return item.text
        if isinstance(item, ContextCompaction):
            for line in item.summary.splitlines():
                if line.startswith(GOAL_PREFIX):
                    return line[len(GOAL_PREFIX) :]
    return None


SUMMARY_RESERVE_FRACTION = 4
"""The summary's reserve is at most a quarter (1/4) of the window."""


def summary_reserve(window: int | None, summary_max_tokens: int) -> int:
    """Return the most tokens a summary may take: ``summary_max_tokens``, but never more
    than a quarter of the window (when it is known). The summarising call asks for at most
    this (its output cap), and a summary over it is discarded."""
    if not window:
        return summary_max_tokens
    return max(1, min(summary_max_tokens, window // SUMMARY_RESERVE_FRACTION))


def summary_budget(window: int, summary_max_tokens: int, instructions_tokens: int) -> int:
    """Return how many tokens of history a summarising compaction may send.

    The window less a reserve for the summary — ``summary_max_tokens``, but never more than
    a quarter of the window, so that a small model (2,048 tokens) still gets most of its
    history to summarise — less the instructions; at least 1.
    """
    return max(1, window - summary_reserve(window, summary_max_tokens) - instructions_tokens)


def summary_prompt(
    history: Sequence[TranscriptItem], *, budget_tokens: int | None = None
) -> list[TranscriptItem]:
    """Return the transcript of a summarising compaction call for ``history``.

    Tool calls stay with their results. When ``budget_tokens`` is given and the history is
    larger, whole units are left out from the middle: the earlier boundary, the user's goal
    (first user message) and the unit with the latest user message are always kept, then
    the most recent units that fit.
    """
    units = _units(history)
    if budget_tokens is not None:
        sizes = [estimate_transcript_tokens(u) for u in units]
        keep: set[int] = set()
        for index, unit in enumerate(units):
            if any(isinstance(i, UserMessage) for i in unit):
                keep.add(index)
                break
        for index in range(len(units) - 1, -1, -1):
            if any(isinstance(i, UserMessage) for i in units[index]):
                keep.add(index)
                break
        if units and is_compaction_boundary(units[0][0]):
            keep.add(0)
        used = sum(sizes[i] for i in keep) + estimate_item_tokens(UserMessage(SUMMARY_REQUEST))
        for index in range(len(units) - 1, -1, -1):
            if index in keep:
                continue
            if used + sizes[index] > budget_tokens:
                continue
            keep.add(index)
            used += sizes[index]
        units = [u for i, u in enumerate(units) if i in keep]
    return [*(item for unit in units for item in unit), UserMessage(SUMMARY_REQUEST)]


def summary_boundary(text: str, history: Sequence[TranscriptItem]) -> ContextCompaction:
    """Return the ``ContextCompaction`` boundary for a model's summary of ``history``.

    The user's goal and latest message are appended verbatim, so that they survive the
    compaction whatever the model wrote.
    """
    lines = [text.strip()]
    goal = _carried_goal(history)
    latest = next((i.text for i in reversed(history) if isinstance(i, UserMessage)), None)
    kept = []
    if goal is not None:
        kept.append(GOAL_PREFIX + goal)
    if latest is not None and latest != goal:
        kept.append(LATEST_PREFIX + latest)
    if kept:
        lines.append("\n".join(kept))
    return ContextCompaction("\n\n".join(lines))
