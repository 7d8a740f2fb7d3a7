"""Engine settings from an ``[engines.<id>]`` table, and where the API key comes from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roder_api.enginekit import EngineSettingsError, SettingsTable, api_key_from_env
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

MODEL_KEYS = frozenset({"context_window", "max_output_tokens", "display_name", "temperature"})
"""The keys a ``models.<id>`` table may hold."""

DEFAULT_MODELS = {"openai": "gpt-5-mini", "openai-chat": "gpt-5-mini"}
"""The model each engine type uses when nothing chooses one, against OpenAI's own API.

An engine pointed at another server has no fixed default: it uses the table's ``model``,
else the first of its ``models`` (else a model must be chosen).
"""

ENGINE_TYPES = ("openai", "openai-chat")
"""The values of ``type`` in an ``[engines.<id>]`` table that make an engine of this plugin."""


class OpenAISettingsError(EngineSettingsError):
    """Raised when an ``[engines.<id>]`` table has an unknown key or a bad value.

    The message starts with the table (``[engines.<id>]``); ``settings_id`` is the engine
    id and ``setting`` the key, so that the runtime can say where the key was written.
    """


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
        read = SettingsTable(engine_id, table, OpenAISettingsError)
        where = read.where
        engine_type = read.values.pop("type", None)
        if engine_type is not None and engine_type not in ENGINE_TYPES:
            raise OpenAISettingsError(
                f"{where} type: expected one of {', '.join(ENGINE_TYPES)}, got {engine_type!r}"
            )
        unknown = read.unknown_key(KNOWN_KEYS)
        if unknown is not None:
            raise OpenAISettingsError(
                f"{where}: unknown key {unknown!r}; known keys: "
                f"{', '.join(sorted(KNOWN_KEYS | {'type'}))}",
                setting=unknown,
            )
        base_url = read.base_url(OPENAI_BASE_URL)
        api_key_env = read.api_key_env(base_url, OPENAI_BASE_URL, DEFAULT_API_KEY_ENV)
        context_window = read.positive_int("context_window")
        models = read.models(context_window, MODEL_KEYS)
        model = read.string("model")
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
            timeout=read.seconds("timeout", 600.0),
            connect_timeout=read.seconds("connect_timeout", 10.0),
            read_timeout=read.seconds("read_timeout", 300.0),
            reasoning_effort=read.string("reasoning_effort"),
            reasoning_summary=(
                read.string("reasoning_summary") or None
                if "reasoning_summary" in read.values
                else "auto"
            ),
            prompt_cache_key=bool(read.values.get("prompt_cache_key", True)),
            compact_threshold=read.threshold(),
            temperature=_temperature(read.values, where),
            max_output_tokens=read.positive_int("max_output_tokens"),
            model_temperatures=_model_temperatures(read.values.get("models"), where),
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
        return api_key_from_env(self.api_key_env)


def _temperature(table: Mapping[str, Any], where: str, path: str | None = None) -> float | None:
    value = table.get("temperature")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise OpenAISettingsError(
            f"{where} temperature: expected a number from 0 to 2, got {value!r}",
            setting=f"{path}.temperature" if path else "temperature",
        )
    return float(value)


def _model_temperatures(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    """Return ``(model id, temperature)`` for each ``models.<id>`` that sets one."""
    if not isinstance(value, Mapping):
        return ()
    found = []
    for model_id, spec in value.items():
        if isinstance(spec, Mapping):
            temperature = _temperature(spec, f"{where} models.{model_id}", f"models.{model_id}")
            if temperature is not None:
                found.append((str(model_id), temperature))
    return tuple(found)
