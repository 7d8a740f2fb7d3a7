"""Engine settings from an ``[engines.anthropic]`` table, and where the API key comes from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roder_api.enginekit import EngineSettingsError, SettingsTable, api_key_from_env
from roder_api.inference import ModelDescriptor

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
"""The Anthropic API's base URL (requests go to ``<base_url>/v1/messages``)."""

DEFAULT_API_KEY_ENV = "ANTHROPIC_API_KEY"
"""The environment variable that holds the key for the default base URL."""

DEFAULT_MODEL = "claude-sonnet-4-6"
"""The model used when neither the runtime nor the engine table names one."""

DEFAULT_MAX_TOKENS = 8192
"""``max_tokens`` sent when neither the model's ``max_output_tokens`` nor the table sets it."""

DEFAULT_CONTEXT_WINDOW = 200_000
"""The context window assumed for a configured model that does not give its own."""

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent with every request."""

KNOWN_KEYS = frozenset(
    {
        "base_url",
        "api_key_env",
        "anthropic_version",
        "model",
        "models",
        "context_window",
        "max_tokens",
        "thinking",
        "compact_threshold",
        "compact_instructions",
        "prompt_cache",
        "timeout",
        "connect_timeout",
        "read_timeout",
    }
)


MODEL_KEYS = frozenset({"context_window", "max_output_tokens", "display_name"})
"""The keys a ``models.<id>`` table may hold."""


class AnthropicSettingsError(EngineSettingsError):
    """Raised when an ``[engines.<id>]`` table has an unknown key or a bad value.

    A ``PluginSettingsError`` (so a ``RoderError`` and a ``ValueError``): the message starts
    with the table (``[engines.<id>]``); ``settings_id`` is the engine id and ``setting``
    the key, so that the runtime reports the engine as misconfigured, with where the key
    was written.
    """


@dataclass(frozen=True, slots=True)
class AnthropicSettings:
    """What one engine is configured with (see the plugin's README for each key).

    ``api_key_env`` is None when no key is sent: a custom ``base_url`` gets a key only from
    an ``api_key_env`` set in the same table. ``thinking``: None (not sent), ``"adaptive"``,
    or a token budget (manual extended thinking). ``compact_threshold``: None (no in-turn
    compaction), a token count, or ``"auto"`` (from the model's context window).
    """

    base_url: str = ANTHROPIC_BASE_URL
    api_key_env: str | None = DEFAULT_API_KEY_ENV
    anthropic_version: str = ANTHROPIC_VERSION
    model: str = DEFAULT_MODEL
    models: tuple[ModelDescriptor, ...] = ()
    context_window: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    thinking: str | int | None = None
    compact_threshold: int | str | None = None
    compact_instructions: str | None = None
    prompt_cache: bool = True
    timeout: float = 600.0
    connect_timeout: float = 10.0
    read_timeout: float = 300.0

    @classmethod
    def from_table(cls, engine_id: str, table: Mapping[str, Any] | None) -> AnthropicSettings:
        """Return the settings of an ``[engines.<engine_id>]`` table (None: the defaults).

        Raise :class:`AnthropicSettingsError` naming the key for an unknown key or bad value.
        """
        read = SettingsTable(engine_id, table, AnthropicSettingsError)
        engine_type = read.values.pop("type", None)
        if engine_type not in (None, "anthropic"):
            raise AnthropicSettingsError(
                f'{read.where} type: expected "anthropic", got {engine_type!r}', setting="type"
            )
        unknown = read.unknown_key(KNOWN_KEYS)
        if unknown is not None:
            raise AnthropicSettingsError(
                f"{read.where}: unknown key {unknown!r}; known keys: "
                f"{', '.join(sorted(KNOWN_KEYS | {'type'}))}",
                setting=unknown,
            )
        base_url = read.base_url(ANTHROPIC_BASE_URL)
        context_window = read.positive_int("context_window")
        return cls(
            base_url=base_url,
            api_key_env=read.api_key_env(base_url, ANTHROPIC_BASE_URL, DEFAULT_API_KEY_ENV),
            anthropic_version=read.string("anthropic_version") or ANTHROPIC_VERSION,
            model=read.string("model") or DEFAULT_MODEL,
            models=read.models(context_window or DEFAULT_CONTEXT_WINDOW, MODEL_KEYS),
            context_window=context_window,
            max_tokens=read.positive_int("max_tokens") or DEFAULT_MAX_TOKENS,
            thinking=_thinking(read.values.get("thinking"), read.where),
            compact_threshold=read.threshold(),
            compact_instructions=read.string("compact_instructions"),
            prompt_cache=read.boolean("prompt_cache", True),
            timeout=read.seconds("timeout", 600.0),
            connect_timeout=read.seconds("connect_timeout", 10.0),
            read_timeout=read.seconds("read_timeout", 300.0),
        )

    def api_key(self) -> str | None:
        """Return the key from ``api_key_env`` (None when no key is to be sent).

        Raise ``ProviderFailure`` (authentication) when the variable is named but unset.
        """
        return api_key_from_env(self.api_key_env)

    def model_descriptor(self, model: str) -> ModelDescriptor | None:
        """Return the configured descriptor of ``model`` (None when it is not listed)."""
        return next((m for m in self.models if m.id == model), None)


def _thinking(value: Any, where: str) -> str | int | None:
    if value is None or value in ("", "off"):
        return None
    if value == "adaptive":
        return "adaptive"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
        return value
    raise AnthropicSettingsError(
        f'{where} thinking: expected "adaptive", "off" or a token budget of at least '
        f"1024, got {value!r}"
    )
