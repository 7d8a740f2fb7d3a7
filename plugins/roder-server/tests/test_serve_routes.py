"""Every route of ``roder serve``, success and error cases, on a real server process."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from serve_support import Server, journal, read_sse, wait_run

pytestmark = pytest.mark.slow

PROBLEM = "application/problem+json"


def _problem(response: httpx.Response, status: int, error: str | None = None) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = dict(response.json())
    assert {"type", "title", "status", "detail", "error"} <= set(body)
    assert body["status"] == status
    if error is not None:
        assert body["error"] == error, body
    return body


def test_listening_line_health_and_openapi(serve: Callable[..., Server]) -> None:
    server = serve()
    assert server.url.startswith("http://127.0.0.1:")
    with server.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").status_code == 200
        doc = c.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.1")
        for path in ("/v1/threads", "/v1/threads/{thread_id}/stream", "/v1/engines"):
            assert path in doc["paths"]
        engines = c.get("/v1/engines").json()
        assert engines["default"] == "scripted"
        assert "scripted" in [e["id"] for e in engines["engines"]]
        _problem(c.get("/no/such/route"), 404)
        _problem(c.delete("/v1/threads"), 405)


def test_threads_crud_and_errors(serve: Callable[..., Server]) -> None:
    server = serve()
    with server.client() as c:
        made = c.post("/v1/threads", json={"thread_id": "t-1", "title": "hello", "extra": {"a": 1}})
        assert made.status_code == 201, made.text
        assert made.json()["thread_id"] == "t-1" and made.json()["extra"] == {"a": 1}
        _problem(c.post("/v1/threads", json={"thread_id": "t-1"}), 409, "ThreadExistsError")
        _problem(c.post("/v1/threads", json={"thread_id": "../x"}), 400, "InvalidThreadIdError")
        _problem(c.post("/v1/threads", json={"nope": 1}), 422)
        _problem(c.post("/v1/threads", content=b"{not json"), 400)
        _problem(c.post("/v1/threads", json=[1]), 422)
        auto = c.post("/v1/threads", json={}).json()["thread_id"]
        assert c.get(f"/v1/threads/{auto}").json()["thread_id"] == auto
        _problem(c.get("/v1/threads/missing"), 404, "ThreadNotFoundError")
        _problem(c.get("/v1/threads/bad%01id"), 400, "InvalidThreadIdError")
        patched = c.patch("/v1/threads/t-1", json={"title": "renamed", "extra": {"b": 2}})
        assert patched.json()["title"] == "renamed" and patched.json()["extra"] == {"b": 2}
        _problem(c.patch("/v1/threads/missing", json={"title": "x"}), 404)
        _problem(c.patch("/v1/threads/t-1", json={"extra": 3}), 422)
        listed = c.get("/v1/threads", params={"limit": 1}).json()
        assert len(listed["threads"]) == 1 and listed["next_cursor"]
        rest = c.get("/v1/threads", params={"limit": 5, "cursor": listed["next_cursor"]}).json()
        ids = {t["thread_id"] for t in listed["threads"] + rest["threads"]}
        assert ids == {"t-1", auto}
        _problem(c.get("/v1/threads", params={"limit": "x"}), 400)
        assert c.delete(f"/v1/threads/{auto}").status_code == 204
        _problem(c.delete(f"/v1/threads/{auto}"), 404)
        _problem(c.get("/v1/threads/t-1/items", params={"view": "nope"}), 400)
        _problem(c.get("/v1/threads/missing/items"), 404)
        _problem(c.get("/v1/threads/missing/events"), 404)
        _problem(c.get("/v1/threads/missing/stream"), 404)
        _problem(c.get("/v1/threads/t-1/events", params={"after": -1}), 400)
        assert c.get("/v1/threads/t-1").json()["title"] == "renamed", "a bad request changed it"


def test_a_run_is_accepted_streamed_and_folded(serve: Callable[..., Server]) -> None:
    server = serve()
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        run = c.post(f"/v1/threads/{tid}/runs", json={"input": "hello there", "turn_id": "r1"})
        assert run.status_code == 202, run.text
        assert run.json()["turn_id"] == "r1" and run.json()["thread_id"] == tid
        with c.stream("GET", f"/v1/threads/{tid}/stream", params={"until": "turn_end"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            messages = [m for m in read_sse(r) if "id" in m]
        assert [int(m["id"]) for m in messages] == list(range(1, len(messages) + 1))
        assert messages[-1]["event"] == "turn_complete"
        status = wait_run(c, tid, "r1")
        assert status["status"] == "completed" and status["usage"]["total_tokens"] > 0
        items = c.get(f"/v1/threads/{tid}/items").json()["items"]
        assert [i["type"] for i in items] == ["user_message", "assistant_message"]
        assert c.get(f"/v1/threads/{tid}/items", params={"view": "replay"}).json()["items"] == items
        events = journal(c, tid)
        assert [e["sequence"] for e in events] == [int(m["id"]) for m in messages]
        page = c.get(f"/v1/threads/{tid}/events", params={"after": 2, "limit": 2}).json()
        assert [e["sequence"] for e in page["events"]] == [3, 4]
        assert page["last_sequence"] == len(events)
        _problem(c.post(f"/v1/threads/{tid}/runs", json={"input": "x", "turn_id": "r1"}), 409)
        _problem(c.get(f"/v1/threads/{tid}/runs/nope"), 404)
        _problem(c.post(f"/v1/threads/{tid}/runs/nope/interrupt"), 404)
        _problem(c.post(f"/v1/threads/{tid}/runs", json={}), 422)
        _problem(c.post(f"/v1/threads/{tid}/runs", json={"input": "x", "multitask": "z"}), 422)
        _problem(c.post(f"/v1/threads/{tid}/runs", json={"input": "x", "engine": "nope"}), 422)
        _problem(c.post("/v1/threads/missing/runs", json={"input": "x"}), 404)
        _problem(c.post(f"/v1/threads/{tid}/approvals/nope", json={"approved": True}), 404)
        _problem(c.post(f"/v1/threads/{tid}/approvals/nope", json={"approved": "y"}), 422)
        assert len(journal(c, tid)) == len(events), "a bad request journaled something"


def test_multitask_reject_interrupt_enqueue_steer(serve: Callable[..., Server]) -> None:
    server = serve()
    long_text = " ".join(f"w{i}" for i in range(200))  # ~4 s at 20 ms a word
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        first = c.post(f"/v1/threads/{tid}/runs", json={"input": long_text}).json()["turn_id"]
        rejected = c.post(f"/v1/threads/{tid}/runs", json={"input": "x", "multitask": "reject"})
        body = _problem(rejected, 409, "ThreadBusyError")
        assert first in str(body["detail"])
        queued = c.post(f"/v1/threads/{tid}/runs", json={"input": "second"}).json()
        assert queued["status"] == "queued"
        steered = c.post(f"/v1/threads/{tid}/runs", json={"input": "faster", "multitask": "steer"})
        assert steered.status_code == 202 and steered.json()["turn_id"] == first
        third = c.post(
            f"/v1/threads/{tid}/runs", json={"input": "now", "multitask": "interrupt"}
        ).json()["turn_id"]
        assert wait_run(c, tid, first)["status"] == "aborted"
        assert wait_run(c, tid, queued["turn_id"])["status"] in ("completed", "aborted")
        assert wait_run(c, tid, third)["status"] == "completed"
        fourth = c.post(f"/v1/threads/{tid}/runs", json={"input": long_text}).json()["turn_id"]
        assert c.post(f"/v1/threads/{tid}/runs/{fourth}/interrupt").status_code == 202
        status = wait_run(c, tid, fourth)
        assert status["status"] == "aborted" and status["reason"] == "interrupted"


def test_body_and_input_limits(serve: Callable[..., Server]) -> None:
    server = serve(top="max_input_bytes = 100\n", extra_config="[server]\nmax_body_bytes = 2000\n")
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        _problem(c.post(f"/v1/threads/{tid}/runs", json={"input": "x" * 101}), 413)
        _problem(c.post(f"/v1/threads/{tid}/runs", json={"input": "x" * 3000}), 413)
        assert journal(c, tid) == []


def test_stream_and_queue_limits(serve: Callable[..., Server]) -> None:
    server = serve(
        top="submission_queue_capacity = 1\n",
        extra_config="[server]\nmax_streams = 1\nheartbeat_s = 0.2\n",
    )
    long_text = " ".join(f"w{i}" for i in range(200))
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        with c.stream("GET", f"/v1/threads/{tid}/stream") as first:
            lines = first.iter_lines()
            assert next(lines).startswith("retry:")
            assert next(line for line in lines if line.startswith(":")) == ": keepalive"
            over = c.get(f"/v1/threads/{tid}/stream")
            _problem(over, 503)
            assert over.headers["retry-after"]
        # The client left a stream blocked in its wait: the server ends it and counts it
        # out (EventStream's disconnect watch), so the one slot is free again.
        deadline = time.monotonic() + 10
        while True:
            with c.stream("GET", f"/v1/threads/{tid}/stream") as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "the stream the client left is still counted"
            time.sleep(0.05)
        c.post(f"/v1/threads/{tid}/runs", json={"input": long_text})
        statuses = [c.post(f"/v1/threads/{tid}/runs", json={"input": "more"}) for _ in range(3)]
        full = [r for r in statuses if r.status_code == 429]
        assert full, [r.text for r in statuses]
        assert full[0].headers["retry-after"]
