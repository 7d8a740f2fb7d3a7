"""Engine settings from an ``[engines.<id>]`` table, and where the API key comes from."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roder_api.errors import PluginSettingsError
from roder_api.inference import ModelDescriptor

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""The OpenAI API's base URL: the default for both engines."""

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
"""The environment variable that holds the key for the default base URL."""

KNOWN_KEYS = frozenset(
    {
        "base_url",
        "api_key_env",
        "model",
        "models",
        "context_window",
        "timeout",
        "connect_timeout",
        "read_timeout",
        "reasoning_effort",
        "reasoning_summary",
        "prompt_cache_key",
        "compact_threshold",
        "temperature",
        "max_output_tokens",
    }
)


DEFAULT_MODELS = {"openai": "gpt-5-mini", "openai-chat": "gpt-5-mini"}
"""The model each engine type uses when nothing chooses one, against OpenAI's own API.

An engine pointed at another server has no fixed default: it uses the table's ``model``,
else the first of its ``models`` (else a model must be chosen).
"""

ENGINE_TYPES = ("openai", "openai-chat")
"""The values of ``type`` in an ``[engines.<id>]`` table that make an engine of this plugin."""

_WHERE = re.compile(r"\[engines\.([^\]]+)\](?: (\w+))?")


class OpenAISettingsError(PluginSettingsError):
    """Raised when an ``[engines.<id>]`` table has an unknown key or a bad value.

    The message starts with the table (``[engines.<id>]``); ``settings_id`` is the engine
    id and ``setting`` the key, so that the runtime can say where the key was written.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        found = _WHERE.match(message)
        settings_id = found.group(1) if found else ""
        super().__init__(settings_id, setting or (found.group(2) if found else None), message)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What one engine is configured with (see the plugin's README for each key).

    ``api_key_env`` is None when no key is sent: a custom ``base_url`` gets a key only from
    an ``api_key_env`` set in the same table. The key itself is never kept here; it is read
    from the environment for each request.
    """

    base_url: str = OPENAI_BASE_URL
    api_key_env: str | None = DEFAULT_API_KEY_ENV
    model: str | None = None
    models: tuple[ModelDescriptor, ...] = ()
    context_window: int | None = None
    timeout: float = 600.0
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    reasoning_effort: str | None = None
    reasoning_summary: str | None = "auto"
    prompt_cache_key: bool = True
    compact_threshold: int | str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    model_temperatures: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_table(cls, engine_id: str, table: Mapping[str, Any] | None) -> EngineSettings:
        """Return the settings of an ``[engines.<engine_id>]`` table (None: the defaults).

        Raise :class:`OpenAISettingsError` naming the key for an unknown key or bad value.
        """
        table = dict(table or {})
        where = f"[engines.{engine_id}]"
        engine_type = table.pop("type", None)
        if engine_type is not None and engine_type not in ENGINE_TYPES:
            raise OpenAISettingsError(
                f"{where} type: expected one of {', '.join(ENGINE_TYPES)}, got {engine_type!r}"
            )
        unknown = sorted(set(table) - KNOWN_KEYS)
        if unknown:
            raise OpenAISettingsError(
                f"{where}: unknown key {unknown[0]!r}; known keys: "
                f"{', '.join(sorted(KNOWN_KEYS | {'type'}))}",
                setting=unknown[0],
            )
        base_url = _string(table, "base_url", where) or OPENAI_BASE_URL
        base_url = base_url.rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise OpenAISettingsError(
                f"{where} base_url: expected an http(s) URL, got {base_url!r}"
            )
        if "api_key_env" in table:
            # An explicit empty string means: send no key.
            api_key_env = _string(table, "api_key_env", where) or None
        else:
            # Never send the default key to a base URL the user pointed elsewhere.
            api_key_env = DEFAULT_API_KEY_ENV if base_url == OPENAI_BASE_URL else None
        context_window = _positive_int(table, "context_window", where)
        models = _models(table.get("models"), context_window, where)
        model = _string(table, "model", where)
        if model is None and models:
            model = models[0].id
        if model is None and base_url == OPENAI_BASE_URL:
            model = DEFAULT_MODELS.get(engine_type or engine_id)
        return cls(
            base_url=base_url,
            api_key_env=api_key_env,
            model=model,
            models=models,
            context_window=context_window,
            timeout=_seconds(table, "timeout", where, 600.0),
            connect_timeout=_seconds(table, "connect_timeout", where, 10.0),
            read_timeout=_seconds(table, "read_timeout", where, 300.0),
            reasoning_effort=_string(table, "reasoning_effort", where),
            reasoning_summary=(
                _string(table, "reasoning_summary", where) or None
                if "reasoning_summary" in table
                else "auto"
            ),
            prompt_cache_key=bool(table.get("prompt_cache_key", True)),
            compact_threshold=_threshold(table.get("compact_threshold"), where),
            temperature=_temperature(table, where),
            max_output_tokens=_positive_int(table, "max_output_tokens", where),
            model_temperatures=_model_temperatures(table.get("models"), where),
        )

    def model_descriptor(self, model: str) -> ModelDescriptor | None:
        """Return the configured descriptor of ``model`` (None when it is not listed)."""
        return next((m for m in self.models if m.id == model), None)

    def context_window_for(self, model: str) -> int | None:
        """Return the model's context window in tokens, when configured."""
        descriptor = self.model_descriptor(model)
        return (descriptor.context_window if descriptor else None) or self.context_window

    def max_output_tokens_for(self, model: str) -> int | None:
        """Return the model's ``max_output_tokens``, else the table's (None: the server's)."""
        descriptor = self.model_descriptor(model)
        per_model = descriptor.max_output_tokens if descriptor else None
        return per_model or self.max_output_tokens

    def temperature_for(self, model: str) -> float | None:
        """Return the model's ``temperature``, else the table's (None: the server's)."""
        return dict(self.model_temperatures).get(model, self.temperature)

    def api_key(self) -> str | None:
        """Return the key from ``api_key_env`` (None when no key is to be sent).

        Raise ``ProviderFailure`` (authentication) when the variable is named but unset.
        """
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            from roder_api.inference import ProviderFailure, ProviderFailureKind

            raise ProviderFailure(
                ProviderFailureKind.AUTHENTICATION,
                f"no API key: set the environment variable {self.api_key_env} "
                "(or api_key_env in the engine's config table)",
            )
        return key


def _string(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise OpenAISettingsError(f"{where} {key}: expected a string, got {value!r}")
    return value


def _threshold(value: Any, where: str) -> int | str | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise OpenAISettingsError(
        f'{where} compact_threshold: expected a positive number of tokens or "auto", got {value!r}'
    )


def _seconds(table: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise OpenAISettingsError(f"{where} {key}: expected a positive number of seconds")
    return float(value)


def _positive_int(table: Mapping[str, Any], key: str, where: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise OpenAISettingsError(f"{where} {key}: expected a positive integer, got {value!r}")
    return value


def _models(value: Any, context_window: int | None, where: str) -> tuple[ModelDescriptor, ...]:
    """Return models from a list of ids or a table ``{id = {context_window = N}}``."""
    if value is None:
        return ()
    if isinstance(value, list):
        if not all(isinstance(v, str) and v for v in value):
            raise OpenAISettingsError(f"{where} models: expected a list of model ids")
        return tuple(ModelDescriptor(v, context_window=context_window) for v in value)
    if isinstance(value, Mapping):
        found = []
        for model_id, spec in value.items():
            spec = spec or {}
            if not isinstance(spec, Mapping):
                raise OpenAISettingsError(f"{where} models.{model_id}: expected a table")
            found.append(
                ModelDescriptor(
                    str(model_id),
                    context_window=_positive_int(
                        spec, "context_window", f"{where} models.{model_id}"
                    )
                    or context_window,
                    max_output_tokens=_positive_int(
                        spec, "max_output_tokens", f"{where} models.{model_id}"
                    ),
                    display_name=_string(spec, "display_name", f"{where} models.{model_id}"),
                )
            )
        return tuple(found)
    raise OpenAISettingsError(f"{where} models: expected a list of ids or a table of models")


def _temperature(table: Mapping[str, Any], where: str) -> float | None:
    value = table.get("temperature")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise OpenAISettingsError(
            f"{where} temperature: expected a number from 0 to 2, got {value!r}"
        )
    return float(value)


def _model_temperatures(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """Return ``(model id, temperature)`` for each ``models.<id>`` that sets one."""
    if not isinstance(value, Mapping):
        return ()
    found = []
    for model_id, spec in value.items():
        if isinstance(spec, Mapping):
            temperature = _temperature(spec, f"{where} models.{model_id}")
            if temperature is not None:
                found.append((str(model_id), temperature))
    return tuple(found)
