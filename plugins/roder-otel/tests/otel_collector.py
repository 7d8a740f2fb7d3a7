"""A loopback OTLP/HTTP receiver for the tests: decodes the protobuf the exporters post."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class CollectorServer(ThreadingHTTPServer):
    """The receiver's server: what was posted to ``/v1/traces`` and ``/v1/metrics``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Collector)
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []

    @property
    def endpoint(self) -> str:
        """Return the base URL the exporters take (``/v1/traces`` is added)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[Span]:
        """Return every span received, in arrival order."""
        return [
            span
            for request in self.traces
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


class _Collector(BaseHTTPRequestHandler):
    server: CollectorServer

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        encoding = self.headers.get("Content-Encoding")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        assert self.headers["Content-Type"] == "application/x-protobuf"
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.server.traces.append(request)
        elif self.path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest()
            metrics.ParseFromString(body)
            self.server.metrics.append(metrics)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serving() -> Iterator[CollectorServer]:
    """Run a receiver in a thread for the duration of the generator (a fixture's body)."""
    server = CollectorServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
