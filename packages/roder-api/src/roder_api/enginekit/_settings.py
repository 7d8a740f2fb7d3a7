"""Reading an ``[engines.<id>]`` table: typed values, with errors that name the table and key.

:class:`SettingsTable` wraps one table and the plugin's own error class; each reader returns
the value or raises that error with a message that starts ``[engines.<id>] <key>:``. The
key itself is read from the environment by :func:`api_key_from_env`, at request time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from roder_api.errors import PluginSettingsError
from roder_api.inference import ModelDescriptor, ProviderFailure, ProviderFailureKind

SettingsErrorFactory = Callable[[str, "str | None"], Exception]
"""Makes the plugin's settings error from a message and the key it is about (or None)."""

_Nested = tuple[Mapping[str, Any], str, str]
"""A table inside the table: its values, where it is (for messages), and its dotted path
(``models.m``: an error's ``setting`` is the path and the key, ``models.m.context_window``)."""


_WHERE = re.compile(r"\[engines\.([^\]]+)\](?: (\w+))?")


class EngineSettingsError(PluginSettingsError):
    """An engine plugin's settings error, made from the message alone.

    The message starts with the table (``[engines.<id>] <key>: ...``); ``settings_id`` is
    read from it, and ``setting`` too unless given (a dotted path for a nested key,
    ``models.m.context_window``), so that the runtime reports the engine as misconfigured,
    with where the key was written. Subclass it for your plugin, and hand the subclass to
    :class:`SettingsTable` as its ``error``.
    """

    def __init__(self, message: str, setting: str | None = None) -> None:
        found = _WHERE.match(message)
        settings_id = found.group(1) if found else ""
        super().__init__(settings_id, setting or (found.group(2) if found else None), message)


class SettingsTable:
    """One ``[engines.<engine_id>]`` table, read key by key.

    ``error(message, key)`` makes the exception every reader raises (the plugin's settings
    error, a ``ValueError`` or a ``roder_api.errors.PluginSettingsError``).
    """

    def __init__(
        self, engine_id: str, table: Mapping[str, Any] | None, error: SettingsErrorFactory
    ) -> None:
        self.values: dict[str, Any] = dict(table or {})
        self.where = f"[engines.{engine_id}]"
        self._error = error

    def fail(self, message: str, key: str | None = None) -> Exception:
        """Return the plugin's error for ``message`` (raise it)."""
        return self._error(message, key)

    def unknown_key(self, known: frozenset[str]) -> str | None:
        """Return the first key (sorted) that is not in ``known``, or None."""
        unknown = sorted(set(self.values) - known)
        return unknown[0] if unknown else None

    def _nested(self, key: str, nested: _Nested | None) -> tuple[Mapping[str, Any], str, str]:
        if nested is None:
            return self.values, self.where, key
        table, where, path = nested
        return table, where, f"{path}.{key}"

    def string(self, key: str, nested: _Nested | None = None) -> str | None:
        """Return a string value (None when absent); ``nested``: in a table of the table."""
        table, where, setting = self._nested(key, nested)
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(f"{where} {key}: expected a string, got {value!r}", setting)
        return value

    def positive_int(self, key: str, nested: _Nested | None = None) -> int | None:
        """Return a positive integer value (None when absent; booleans are refused)."""
        table, where, setting = self._nested(key, nested)
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(f"{where} {key}: expected a positive integer, got {value!r}", setting)
        return value

    def seconds(self, key: str, default: float) -> float:
        """Return a positive number of seconds (``default`` when absent)."""
        value = self.values.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self.fail(f"{self.where} {key}: expected a positive number of seconds", key)
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        """Return ``true`` or ``false`` (``default`` when absent)."""
        value = self.values.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{self.where} {key}: expected true or false, got {value!r}", key)
        return value

    def threshold(self, key: str = "compact_threshold") -> int | str | None:
        """Return a compaction trigger: a positive number of tokens, ``"auto"``, or None."""
        value = self.values.get(key)
        if value is None:
            return None
        if value == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        raise self.fail(
            f'{self.where} {key}: expected a positive number of tokens or "auto", got {value!r}',
            key,
        )

    def base_url(self, default: str) -> str:
        """Return ``base_url`` without a trailing slash (``default`` when absent).

        It must be an http(s) URL.
        """
        base_url = (self.string("base_url") or default).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise self.fail(
                f"{self.where} base_url: expected an http(s) URL, got {base_url!r}", "base_url"
            )
        return base_url

    def api_key_env(self, base_url: str, default_url: str, default_env: str) -> str | None:
        """Return the variable the key is read from (None: send no key).

        An explicit empty ``api_key_env`` sends no key; without one, the default variable
        applies only to the default base URL: the default key is never sent to a server the
        user pointed elsewhere.
        """
        if "api_key_env" in self.values:
            return self.string("api_key_env") or None
        return default_env if base_url == default_url else None

    def models(
        self,
        context_window: int | None,
        known: frozenset[str] | None = None,
        key: str = "models",
    ) -> tuple[ModelDescriptor, ...]:
        """Return ``models``: a list of ids, or a table ``{id = {context_window = N, ...}}``.

        A model's ``context_window`` defaults to ``context_window``; its table may also set
        ``max_output_tokens`` and ``display_name``. ``known``: the keys a model's table may
        hold (None: any, for keys the plugin reads itself).
        """
        value = self.values.get(key)
        if value is None:
            return ()
        if isinstance(value, list):
            if not all(isinstance(v, str) and v for v in value):
                raise self.fail(f"{self.where} {key}: expected a list of model ids", key)
            return tuple(ModelDescriptor(v, context_window=context_window) for v in value)
        if not isinstance(value, Mapping):
            raise self.fail(f"{self.where} {key}: expected a list of ids or a table of models", key)
        found = []
        for model_id, spec in value.items():
            spec = spec or {}
            path = f"{key}.{model_id}"
            here = f"{self.where} {path}"
            if not isinstance(spec, Mapping):
                raise self.fail(f"{here}: expected a table", path)
            extra = sorted(set(spec) - known) if known is not None else []
            if extra:
                choices = ", ".join(sorted(known or ()))
                raise self.fail(
                    f"{here}: unknown key {extra[0]!r}; known keys: {choices}",
                    f"{path}.{extra[0]}",
                )
            nested = (spec, here, path)
            found.append(
                ModelDescriptor(
                    str(model_id),
                    context_window=self.positive_int("context_window", nested) or context_window,
                    max_output_tokens=self.positive_int("max_output_tokens", nested),
                    display_name=self.string("display_name", nested),
                )
            )
        return tuple(found)


def api_key_from_env(variable: str | None) -> str | None:
    """Return the API key held by the environment variable ``variable`` (None: no key).

    Raise ``ProviderFailure`` (``AUTHENTICATION``, not retried) when the variable is named
    but unset or blank. Call it for each request, and never keep the key.
    """
    if variable is None:
        return None
    key = os.environ.get(variable, "").strip()
    if not key:
        raise ProviderFailure(
            ProviderFailureKind.AUTHENTICATION,
            f"no API key: set the environment variable {variable} "
            "(or api_key_env in the engine's config table)",
        )
    return key
