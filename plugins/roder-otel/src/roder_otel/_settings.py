"""The ``[otel]`` table and the standard ``OTEL_*`` variables: whether and where to export.

The export is on when the ``[otel]`` table sets ``endpoint`` (or ``enabled = true``), or when
one of the standard variables names an endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) — unless ``enabled = false`` or
``OTEL_SDK_DISABLED=true``. Keys of ``[otel]``: ``enabled``, ``endpoint`` (the collector's
OTLP/HTTP base URL, ``/v1/traces`` and ``/v1/metrics`` are added), ``headers`` (a table),
``service_name``, ``capture_content``, ``metric_export_interval_ms``. The standard variables
the SDK's exporter reads (``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ...) still apply
to what the table leaves unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roder_api.tracing import capture_content

_KEYS = (
    "enabled",
    "endpoint",
    "headers",
    "service_name",
    "capture_content",
    "metric_export_interval_ms",
)


class OtelSettingsError(ValueError):
    """Raised for a bad key or value of the ``[otel]`` table (``key`` names it)."""

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        super().__init__(message)


@dataclass(frozen=True)
class OtelSettings:
    """Where and what the observer exports (see the module docstring)."""

    enabled: bool = False
    endpoint: str | None = None
    """The OTLP/HTTP base URL (None: the exporter's own default and variables)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    service_name: str = "roder"
    capture_content: bool = False
    metric_export_interval_ms: int = 60_000

    @classmethod
    def load(cls, table: Mapping[str, Any], environ: Mapping[str, str]) -> OtelSettings:
        """Return the settings of ``[otel]`` with the standard variables as fallback."""
        for key in table:
            if key not in _KEYS:
                raise OtelSettingsError(key, f"unknown key {key!r}; known: {', '.join(_KEYS)}")
        endpoint = table.get("endpoint")
        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
            raise OtelSettingsError("endpoint", f"expected a URL, got {endpoint!r}")
        headers = table.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(v, str) for v in headers.values()
        ):
            raise OtelSettingsError("headers", "expected a table of strings")
        flag = table.get("enabled")
        if flag is not None and not isinstance(flag, bool):
            raise OtelSettingsError("enabled", f"expected true or false, got {flag!r}")
        content = table.get("capture_content")
        if content is not None and not isinstance(content, bool):
            raise OtelSettingsError("capture_content", f"expected true or false, got {content!r}")
        interval = table.get("metric_export_interval_ms", 60_000)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise OtelSettingsError(
                "metric_export_interval_ms", f"expected milliseconds above 0, got {interval!r}"
            )
        service = table.get("service_name", environ.get("OTEL_SERVICE_NAME") or "roder")
        if not isinstance(service, str) or not service:
            raise OtelSettingsError("service_name", f"expected a name, got {service!r}")
        from_env = any(
            environ.get(var)
            for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        enabled = flag if flag is not None else bool(endpoint) or from_env
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            enabled = False
        return cls(
            enabled=enabled,
            endpoint=endpoint.rstrip("/") if isinstance(endpoint, str) else None,
            headers=dict(headers),
            service_name=service,
            capture_content=content if content is not None else capture_content(environ),
            metric_export_interval_ms=interval,
        )
