"""What a thread's tokens cost, priced by ``genai-prices`` (pydantic's maintained prices).

Every ``UsageUpdated`` of a journal is one billed line: turns, compaction, discarded
compaction, and the failed attempts that were retried (billed as observed). A line is
priced by its ``model`` and ``provider`` (the engine id; when the price library has no
such provider the model alone is matched, as the library does). A line whose model has no
known price, or that names no model (journals from before models were recorded), is
*unpriced*: reported as such and counted as nothing — never guessed.

``genai_prices`` is imported on first use only (it loads a price snapshot): nothing pays for
it unless a budget is set or a cost is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from roder_api.events import JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage

ZERO = Decimal(0)


@dataclass(frozen=True, slots=True)
class PricedUsage:
    """One billed usage line and its price (``usd`` None: no known price)."""

    sequence: int
    turn_id: str | None
    purpose: str
    model: str | None
    provider: str | None
    usage: TokenUsage
    usd: Decimal | None


@dataclass(slots=True)
class CostRow:
    """A group of billed lines (by turn, purpose or model), summed."""

    key: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    usd: Decimal = ZERO
    lines: int = 0
    unpriced: int = 0
    """How many lines have no known price (their cost is not in ``usd``)."""

    def to_json(self) -> dict[str, Any]:
        """Return the row as ``roder threads cost --json`` prints it."""
        return {
            "key": self.key,
            "usd": str(self.usd),
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "cached_prompt_tokens": self.usage.cached_prompt_tokens,
            "lines": self.lines,
            "unpriced_lines": self.unpriced,
        }


@functools.lru_cache(maxsize=1)
def _prices() -> Any:
    import genai_prices  # lazy: loads the price snapshot

    return genai_prices


def price(usage: TokenUsage, model: str | None, provider: str | None = None) -> Decimal | None:
    """Return the USD price of ``usage`` on ``model``, or None when it has no known price."""
    if not model:
        return None
    if usage.is_zero():
        return ZERO
    prices = _prices()
    tokens = prices.Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_tokens=usage.cached_prompt_tokens,
        cache_write_tokens=usage.cache_creation_prompt_tokens,
    )
    for provider_id in (provider, None) if provider else (None,):
        try:
            result = prices.calc_price(tokens, model, provider_id=provider_id)
        except LookupError:
            continue  # that provider is not in the library: match on the model alone
        return Decimal(result.total_price)
    return None


def priced_lines(events: Iterable[JournalEvent]) -> list[PricedUsage]:
    """Return every billed usage line of a journal with its price."""
    lines = []
    for entry in events:
        event = entry.event
        if isinstance(event, UsageUpdated):
            lines.append(
                PricedUsage(
                    entry.sequence,
                    event.turn_id,
                    str(event.purpose),
                    event.model,
                    event.provider,
                    event.usage,
                    price(event.usage, event.model, event.provider),
                )
            )
    return lines


def group(lines: Sequence[PricedUsage], by: str) -> list[CostRow]:
    """Return the lines summed by ``turn``, ``purpose`` or ``model``, in journal order."""
    rows: dict[str, CostRow] = {}
    for line in lines:
        if by == "turn":
            key = line.turn_id or "(no turn)"
        elif by == "purpose":
            key = line.purpose
        elif by == "model":
            key = f"{line.provider}/{line.model}" if line.model else "(model not recorded)"
        else:
            raise ValueError(f"cannot group by {by!r}: turn, purpose or model")
        row = rows.setdefault(key, CostRow(key))
        row.usage = row.usage + line.usage
        row.lines += 1
        if line.usd is None:
            row.unpriced += 1
        else:
            row.usd += line.usd
    return list(rows.values())


def unpriced_models(lines: Sequence[PricedUsage]) -> list[str]:
    """Return the models (``provider/model``) whose usage has no known price."""
    found = {
        f"{line.provider}/{line.model}" if line.model else "(model not recorded)"
        for line in lines
        if line.usd is None
    }
    return sorted(found)
