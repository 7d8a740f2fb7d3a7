"""Settings of the ``llm`` engine, from its ``[engines.llm]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roder_api.enginekit import EngineSettingsError, SettingsTable

KNOWN_KEYS = frozenset({"model", "options", "timeout"})
"""The keys an ``[engines.llm]`` table may hold."""

DEFAULT_TIMEOUT_S = 600.0
"""How long the engine waits for the next chunk of a reply before it fails the call."""


class LlmSettingsError(EngineSettingsError):
    """Raised when an ``[engines.llm]`` table has an unknown key or a bad value."""


@dataclass(frozen=True, slots=True)
class LlmSettings:
    """What the ``llm`` engine is configured with.

    ``model``: the model used when the runtime names none (unset: llm's own default model,
    ``llm models default``). ``options``: llm options sent with every prompt (``{"temperature"
    = 0.2}``; each model documents its own, ``llm models --options``). ``timeout``: seconds
    to wait for the next chunk.
    """

    model: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_table(cls, engine_id: str, table: Mapping[str, Any] | None) -> LlmSettings:
        """Return the settings of an ``[engines.<engine_id>]`` table (None: the defaults)."""
        reader = SettingsTable(engine_id, table, lambda m, k: LlmSettingsError(m, k))
        unknown = reader.unknown_key(KNOWN_KEYS)
        if unknown is not None:
            known = ", ".join(sorted(KNOWN_KEYS))
            raise reader.fail(f"{reader.where} {unknown}: unknown key (known: {known})", unknown)
        options = reader.values.get("options", {})
        if not isinstance(options, Mapping):
            raise reader.fail(f"{reader.where} options: expected a table of llm options", "options")
        return cls(
            model=reader.string("model"),
            options=dict(options),
            timeout=reader.seconds("timeout", DEFAULT_TIMEOUT_S),
        )
