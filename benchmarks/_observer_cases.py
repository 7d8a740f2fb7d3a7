"""The observer cases of ``turn_bench.py --observers``: how a runtime is given observers.

* ``none``: no observer plugin (the registry has no observer: the seam is skipped);
* ``installed``: roder-otel loaded through its hook with no ``[otel]`` table and no
  ``OTEL_*`` variable, so it registers nothing (what an installed, unconfigured plugin costs);
* ``otel``: roder-otel's observer exporting every turn's spans through the SDK's batch span
  processor to an in-memory exporter, and metrics to an in-memory reader (the export work
  without a network).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from roder_api import ExtensionRegistryBuilder

CASES = ("none", "installed", "otel")
LABELS = {
    "none": "no observer plugin",
    "installed": "roder-otel installed, not configured",
    "otel": "roder-otel exporting (in-memory)",
}


def available() -> bool:
    """Return True when roder-otel and the OpenTelemetry SDK can be imported."""
    from importlib.util import find_spec

    return find_spec("roder_otel") is not None and find_spec("opentelemetry.sdk") is not None


def unconfigured_environment() -> None:
    """Drop the ``OTEL_*`` variables that would turn the export on in this process."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]


def builder_for(case: str) -> tuple[ExtensionRegistryBuilder, Callable[[], Any]]:
    """Return a builder with ``case``'s observers and a function returning what was exported."""
    if case == "none":
        return ExtensionRegistryBuilder(), lambda: None
    from roder_otel import plugin as otel_plugin

    if case == "installed":
        builder = ExtensionRegistryBuilder(settings={})
        info = builder.load_plugin("otel", otel_plugin)
        if info.error is not None or info.observers:
            raise SystemExit(f"roder-otel did not stay off: {info}")
        return builder, lambda: None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from roder_otel import OtelObserver

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    observer = OtelObserver(tracer_provider, meter_provider)
    return ExtensionRegistryBuilder().observer(observer), exporter.get_finished_spans
