"""The API against its own ``/openapi.json``, property-based (schemathesis): generated
requests to every route of a running ``roder serve`` never get a 5xx, and every response
(status, content type, body) is one the document allows. The streams too: schemathesis
reads an event stream for a bounded time (the request's timeout) and checks each message
against the document's message schema (``data`` against ``JournalEvent``); generated
stream requests go to threads with a finished and a live run now and then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from serve_support import Server

pytestmark = pytest.mark.slow

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


EXAMPLES = 15
"""Generated requests per operation: the whole test stays within a couple of minutes."""
STREAM_S = 1.5
"""How long one generated stream request is read (schemathesis: its timeout, in total)."""
MAX_STREAMS = 4
TOP = f"[server]\nheartbeat_s = 0.5\nmax_streams = {MAX_STREAMS}\n"
LIVE = " ".join(f"w{i}" for i in range(3000))  # a run that outlives the test (20 ms a word)


def test_no_5xx_and_no_response_outside_the_schema(serve: Callable[..., Server]) -> None:
    server = serve(top=TOP)
    with server.client() as c:
        # Something for the generated ids to find now and then, besides 404s.
        c.post("/v1/threads", json={"thread_id": "known"})
        c.post("/v1/threads/known/runs", json={"input": "hi", "turn_id": "known-run"})
        c.post("/v1/threads", json={"thread_id": "live"})
        c.post("/v1/threads/live/runs", json={"input": LIVE, "turn_id": "live-run"})
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures: list[str] = []
    operations = 0
    calls: list[int] = []
    streamed: list[int] = []  # the messages of each stream answered 200
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        cases = operation.as_strategy()
        if operation.path.endswith("/stream"):
            # A stream never ends by itself (`until=turn_end` may not end it either): it is
            # read for STREAM_S; and it goes to a thread with events now and then.
            cases = st.tuples(cases, st.sampled_from([None, "known", "live"])).map(_on_thread)

        @given(case=cases)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            if case.operation.path.endswith("/stream"):
                response = case.call(timeout=(10, STREAM_S))
                case.validate_response(response, checks=CHECKS)
                if response.status_code == 200:
                    streamed.append(response.text.count("\nevent: "))
            else:
                response = case.call_and_validate(checks=CHECKS)
            calls.append(response.status_code)

        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collected: every operation is tried
            failures.append(f"{operation.label}: {exc}")
    assert operations >= 10, f"only {operations} operations in /openapi.json"
    assert len(calls) >= operations * 5, f"{len(calls)} requests for {operations} operations"
    assert any(200 <= status < 300 for status in calls), "no request ever succeeded"
    assert not failures, "\n\n".join(failures)
    assert any(streamed), f"no generated stream delivered an event: {streamed}"
    # Every stream a client left was closed and counted out: max_streams open at once.
    _open_max_streams(server.url)


def _on_thread(drawn: tuple[Any, str | None]) -> Any:
    case, thread_id = drawn
    if thread_id is not None:
        case.path_parameters = {**case.path_parameters, "thread_id": thread_id}
    return case


def _open_max_streams(url: str) -> None:
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=30)) as c:
        streams = [
            c.stream("GET", "/v1/threads/known/stream", params={"after": 0})
            for _ in range(MAX_STREAMS)
        ]
        try:
            statuses = [s.__enter__().status_code for s in streams]
        finally:
            for s in streams:
                s.__exit__(None, None, None)
    assert statuses == [200] * MAX_STREAMS, f"streams left counted as open: {statuses}"
