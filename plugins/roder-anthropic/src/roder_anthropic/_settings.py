"""Engine settings from an ``[engines.anthropic]`` table, and where the API key comes from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roder_api.errors import RoderError
from roder_api.inference import ModelDescriptor, ProviderFailure, ProviderFailureKind

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


class AnthropicSettingsError(RoderError, ValueError):
    """Raised when an ``[engines.<id>]`` table has an unknown key or a bad value."""


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
        table = dict(table or {})
        where = f"[engines.{engine_id}]"
        unknown = sorted(set(table) - KNOWN_KEYS)
        if unknown:
            raise AnthropicSettingsError(
                f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(KNOWN_KEYS))}"
            )
        base_url = (_string(table, "base_url", where) or ANTHROPIC_BASE_URL).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise AnthropicSettingsError(
                f"{where} base_url: expected an http(s) URL, got {base_url!r}"
            )
        if "api_key_env" in table:
            api_key_env = _string(table, "api_key_env", where) or None  # "" sends no key
        else:
            # Never send the default key to a base URL the user pointed elsewhere.
            api_key_env = DEFAULT_API_KEY_ENV if base_url == ANTHROPIC_BASE_URL else None
        context_window = _positive_int(table, "context_window", where)
        return cls(
            base_url=base_url,
            api_key_env=api_key_env,
            anthropic_version=_string(table, "anthropic_version", where) or ANTHROPIC_VERSION,
            model=_string(table, "model", where) or DEFAULT_MODEL,
            models=_models(table.get("models"), context_window, where),
            context_window=context_window,
            max_tokens=_positive_int(table, "max_tokens", where) or DEFAULT_MAX_TOKENS,
            thinking=_thinking(table.get("thinking"), where),
            compact_threshold=_threshold(table.get("compact_threshold"), where),
            compact_instructions=_string(table, "compact_instructions", where),
            prompt_cache=_bool(table, "prompt_cache", where, True),
            timeout=_seconds(table, "timeout", where, 600.0),
            connect_timeout=_seconds(table, "connect_timeout", where, 10.0),
            read_timeout=_seconds(table, "read_timeout", where, 300.0),
        )

    def api_key(self) -> str | None:
        """Return the key from ``api_key_env`` (None when no key is to be sent).

        Raise ``ProviderFailure`` (authentication) when the variable is named but unset.
        """
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ProviderFailure(
                ProviderFailureKind.AUTHENTICATION,
                f"no API key: set the environment variable {self.api_key_env} "
                "(or api_key_env in the engine's config table)",
            )
        return key

    def model_descriptor(self, model: str) -> ModelDescriptor | None:
        """Return the configured descriptor of ``model`` (None when it is not listed)."""
        return next((m for m in self.models if m.id == model), None)


def _string(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise AnthropicSettingsError(f"{where} {key}: expected a string, got {value!r}")
    return value


def _bool(table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise AnthropicSettingsError(f"{where} {key}: expected true or false, got {value!r}")
    return value


def _seconds(table: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise AnthropicSettingsError(f"{where} {key}: expected a positive number of seconds")
    return float(value)


def _positive_int(table: Mapping[str, Any], key: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise AnthropicSettingsError(f"{where} {key}: expected a positive integer, got {value!r}")
    return value


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


def _threshold(value: Any, where: str) -> int | str | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise AnthropicSettingsError(
        f'{where} compact_threshold: expected a positive number of tokens or "auto", got {value!r}'
    )


def _models(value: Any, context_window: int | None, where: str) -> tuple[ModelDescriptor, ...]:
    """Return models from a list of ids or a table ``{id = {context_window = N, ...}}``."""
    window = context_window or DEFAULT_CONTEXT_WINDOW
    if value is None:
        return ()
    if isinstance(value, list):
        if not all(isinstance(v, str) and v for v in value):
            raise AnthropicSettingsError(f"{where} models: expected a list of model ids")
        return tuple(ModelDescriptor(v, context_window=window) for v in value)
    if isinstance(value, Mapping):
        found = []
        for model_id, spec in value.items():
            spec = spec or {}
            here = f"{where} models.{model_id}"
            if not isinstance(spec, Mapping):
                raise AnthropicSettingsError(f"{here}: expected a table")
            extra = sorted(set(spec) - {"context_window", "max_output_tokens", "display_name"})
            if extra:
                raise AnthropicSettingsError(f"{here}: unknown key {extra[0]!r}")
            found.append(
                ModelDescriptor(
                    str(model_id),
                    context_window=_positive_int(spec, "context_window", here) or window,
                    max_output_tokens=_positive_int(spec, "max_output_tokens", here),
                    display_name=_string(spec, "display_name", here),
                )
            )
        return tuple(found)
    raise AnthropicSettingsError(f"{where} models: expected a list of ids or a table of models")
