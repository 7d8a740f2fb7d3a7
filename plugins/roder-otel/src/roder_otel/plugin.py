"""The entry point: register the OpenTelemetry observer when an export is configured."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from roder_api import hookimpl
from roder_api.errors import PluginSettingsError
from roder_api.observers import Observer
from roder_otel._observer import OtelObserver
from roder_otel._settings import OtelSettings, OtelSettingsError


@hookimpl
def register_observers(
    register: Callable[[Observer], None], settings: Mapping[str, Mapping[str, Any]]
) -> None:
    """Register :class:`OtelObserver` when ``[otel]`` or the ``OTEL_*`` variables ask."""
    try:
        config = OtelSettings.load(settings.get("otel", {}), os.environ)
    except OtelSettingsError as exc:
        raise PluginSettingsError("otel", exc.key, str(exc)) from None
    if config.enabled:
        register(OtelObserver.exporting(config))
