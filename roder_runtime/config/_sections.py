"""The sections of the configuration: retries, compaction, tools and budgets (dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field

from roder_api.tools import ApprovalPolicy


@dataclass
class ReliabilityConfig:
    """Retry policy for provider calls.

    ``provider_retry_max_attempts`` counts every attempt, the first included. Backoff starts
    at ``provider_retry_initial_backoff_ms`` (0 allowed), doubles per retry, is jittered and
    capped at ``provider_retry_max_backoff_ms``; a provider's ``retry_after`` is honoured.
    """

    provider_retry_max_attempts: int = 3
    provider_retry_initial_backoff_ms: int = 1000
    provider_retry_max_backoff_ms: int = 30_000


@dataclass
class CompactionConfig:
    """When and how compaction runs.

    Automatic compaction runs before a model call when the estimated replay size passes
    ``auto_compact_fraction`` of the model's context window (0 disables it).
    """

    auto_compact_fraction: float = 0.8
    summary_max_tokens: int = 2000


@dataclass
class ToolsConfig:
    """Which tools a turn offers and the limits of the agent loop.

    ``enabled``: the tool names offered when a session names none (None: every registered
    tool). ``max_tool_steps``: tool steps per turn; calls past it get error results and the
    turn ends. ``max_tool_output_bytes``: a result longer than this is cut, with a note.
    ``approval`` maps tool names to ``auto``, ``ask`` or ``deny`` (without an entry:
    ``ask`` when the tool sets ``requires_approval``, else ``auto``).
    """

    enabled: list[str] | None = None
    max_tool_steps: int = 32
    max_tool_output_bytes: int = 65536
    approval: dict[str, ApprovalPolicy] = field(default_factory=dict)


@dataclass
class BudgetConfig:
    """Spending limits in US dollars, priced with ``genai-prices`` (None: no limit).

    A turn whose next model call would take the turn's or the thread's cost past a limit
    ends with ``ErrorEvent`` (which budget, by how much) and ``TurnAborted(turn_id,
    "budget_exceeded")`` before that call. Usage of a model without a known price counts
    nothing toward a budget (``roder threads cost`` says which models are unpriced).
    """

    max_usd_per_turn: float | None = None
    max_usd_per_thread: float | None = None

    @property
    def enabled(self) -> bool:
        """Return True when any limit is set."""
        return self.max_usd_per_turn is not None or self.max_usd_per_thread is not None
