"""The installed ``roder`` exports to a collector, and ``roder threads trace`` agrees with it.

``roder prompt`` runs as a subprocess with the plugin found through its entry point and the
export configured by ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``[otel]``; the loopback receiver
decodes what arrives. Then ``roder threads trace``, in another process after the first one
exited, rebuilds the same turns from the journal: the spans must match field by field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_collector import CollectorServer

from roder_api.tracing import CAPTURE_CONTENT_VARIABLE

pytestmark = pytest.mark.timeout(300)  # three interpreter start-ups on a busy machine


def _env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RODER_", "OTEL_"))
    }  # hermetic: no export, store or plugin choice from the caller's environment
    env["RODER_HOME"] = str(tmp_path / "home")
    env["RODER_THREADS_PATH"] = str(tmp_path / "threads")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _roder(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "roder_runtime", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done


def _live_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_live_value(v) for v in value.array_value.values)
    return getattr(value, kind)


def _json_value(value: dict[str, Any]) -> Any:
    ((kind, found),) = value.items()
    if kind == "arrayValue":
        return tuple(_json_value(v) for v in found["values"])
    return int(found) if kind == "intValue" else found


def _live_shapes(spans: list[Span]) -> list[tuple[Any, ...]]:
    names = {span.span_id.hex(): span.name for span in spans}
    return sorted(
        (
            span.name,
            names.get(span.parent_span_id.hex()) if span.parent_span_id else None,
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            int(span.kind),
            tuple(sorted((a.key, _live_value(a.value)) for a in span.attributes)),
            int(span.status.code),
            span.status.message,
        )
        for span in spans
    )


def _rebuilt_shapes(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    names = {span["spanId"]: span["name"] for span in spans}
    return sorted(
        (
            span["name"],
            names.get(span["parentSpanId"]) if "parentSpanId" in span else None,
            int(span["startTimeUnixNano"]),
            int(span["endTimeUnixNano"]),
            span["kind"],
            tuple(sorted((a["key"], _json_value(a["value"])) for a in span["attributes"])),
            span["status"]["code"],
            span["status"].get("message", ""),
        )
        for span in spans
    )


@pytest.mark.parametrize("configured_by", ["variables", "config_toml"])
def test_roder_prompt_exports_and_threads_trace_rebuilds_the_same_spans(
    tmp_path: Path, collector: CollectorServer, configured_by: str
) -> None:
    env = _env(tmp_path)
    if configured_by == "variables":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
        env[CAPTURE_CONTENT_VARIABLE] = "true"  # the content opt-in, by its variable
    else:
        home = Path(env["RODER_HOME"])
        home.mkdir(parents=True)
        (home / "config.toml").write_text(
            f'[otel]\nendpoint = "{collector.endpoint}"\nservice_name = "from-config"\n'
        )
    first = _roder(env, "prompt", "what is otel?")
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    _roder(env, "prompt", "-c", "and then?")

    live = collector.spans()  # each process flushed its spans as its runtime closed
    assert sorted(s.name for s in live if not s.parent_span_id) == ["invoke_agent roder"] * 2
    assert len({s.trace_id for s in live}) == 2
    for span in live:
        attributes = {a.key: _live_value(a.value) for a in span.attributes}
        assert attributes["gen_ai.conversation.id"] == thread_id
        if span.parent_span_id:
            assert attributes["gen_ai.operation.name"] == "chat"
            assert attributes["gen_ai.provider.name"] == "scripted"
            assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
            assert attributes["gen_ai.usage.output_tokens"] > 0
        captured = "gen_ai.input.messages" in attributes or "gen_ai.output.messages" in attributes
        assert captured is (configured_by == "variables")
    service = {
        a.key: a.value.string_value
        for a in collector.traces[0].resource_spans[0].resource.attributes
    }["service.name"]
    assert service == ("roder" if configured_by == "variables" else "from-config")
    metrics = {
        metric.name
        for request in collector.metrics
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert metrics == {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}

    # A third process, after the others exited, rebuilds the turns from the journal alone.
    out = tmp_path / "trace.json"
    rebuild_env = {k: v for k, v in env.items() if k != "OTEL_EXPORTER_OTLP_ENDPOINT"}
    _roder(rebuild_env, "threads", "trace", thread_id, "-o", str(out))
    rebuilt = _rebuilt_shapes(json.loads(out.read_text()))
    assert len(rebuilt) == len(live) == 4
    assert _live_shapes(live) == rebuilt
