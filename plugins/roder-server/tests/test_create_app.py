"""``create_app`` in process: extra routes reach the tenant's runtime, dispatcher and store."""

from __future__ import annotations

from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from roder_runtime import Runtime
from roder_server import ServerSettings, create_app


async def _extra(request: Request) -> Response:
    tenant = request.app.state.server.for_request(request)
    thread = await tenant.runtime.create_thread()
    turn_id, status = await tenant.dispatcher.submit(thread.thread_id, "hi there")
    store = await tenant.store()
    last = await store.wait_for_events(thread.thread_id, 0, 10)
    return JSONResponse({"turn_id": turn_id, "status": status, "last": last})


def test_extra_routes_submit_runs_and_wait_for_events(tmp_path: Path) -> None:
    runtime = Runtime.from_config(
        {"thread_store": {"backend": "jsonl", "path": str(tmp_path / "threads")}}
    )
    app = create_app(
        runtime,
        ServerSettings(heartbeat_s=1),
        tokens={},
        routes=[Route("/extra", _extra, methods=["POST"])],
    )
    try:
        with TestClient(app) as client:
            body = client.post("/extra").json()
            assert body["status"] == "running" and body["last"] >= 1
            assert client.get("/healthz").json() == {"status": "ok"}
            bad = client.get("/v1/threads/nope")
            assert bad.status_code == 404 and bad.json()["error"] == "ThreadNotFoundError"
    finally:
        anyio.run(runtime.aclose)  # the app never closes the runtime it was given
