"""OpenTelemetry GenAI traces and metrics of Roder's turns, exported over OTLP/HTTP.

:class:`OtelObserver` is a Roder observer: it folds each thread's journaled events with
``roder_api.tracing`` (the code ``roder threads trace`` rebuilds traces with, so live and
rebuilt traces have the same tree) and emits the spans and the ``gen_ai.client.*``
metrics through the OpenTelemetry SDK once a turn (or a compaction) has ended.
"""

from __future__ import annotations

from roder_otel._observer import OtelObserver
from roder_otel._settings import OtelSettings, OtelSettingsError

__version__ = "0.1.0"

__all__ = ["OtelObserver", "OtelSettings", "OtelSettingsError", "__version__"]
