"""Bearer tokens (401, constant-time compare, open health routes, loopback only without
tokens) and tenants: another tenant's thread is a 404 on every route, on every store."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from serve_support import ASK, CALL, RODER, Server, tool_env, wait_asked, wait_run

pytestmark = pytest.mark.slow

TOKENS = {"RODER_SERVER_TOKENS": "tok-a=acme,tok-b=globex,tok-d"}


def test_tokens_are_required_except_for_health(serve: Callable[..., Server]) -> None:
    server = serve(env=TOKENS)
    with server.client() as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        for response in (
            anonymous.get("/v1/threads"),
            anonymous.get("/v1/threads", headers={"Authorization": "Bearer wrong"}),
            anonymous.get("/v1/threads", headers={"Authorization": "tok-d"}),
        ):
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"] == "AuthenticationError"
    with server.client("tok-d") as c:
        assert c.get("/v1/threads").status_code == 200


def test_without_tokens_only_loopback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path)
    done = subprocess.run(
        [str(RODER), "serve", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "RODER_SERVER_TOKENS" in lines[0] and "0.0.0.0" in lines[0]


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_tenants_see_only_their_threads(
    serve: Callable[..., Server], backend: str, tmp_path: Path
) -> None:
    server = serve(backend, env={**TOKENS, **tool_env(tmp_path)}, extra_config=ASK)
    with server.client("tok-a") as acme, server.client("tok-b") as globex:
        tid = acme.post("/v1/threads", json={"thread_id": "shared-name"}).json()["thread_id"]
        run = acme.post(f"/v1/threads/{tid}/runs", json={"input": "hi", "turn_id": "r1"})
        assert run.status_code == 202
        assert wait_run(acme, tid, "r1")["status"] == "completed"
        # r2 runs and waits for the owner's approval of a real call: the probes below use
        # that call id and that running turn, so a 404 means "not yours", not "no such".
        run = acme.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r2"})
        assert run.status_code == 202
        call_id = wait_asked(acme, tid)["call_id"]
        assert acme.get(f"/v1/threads/{tid}/runs/r2").json()["status"] == "running"
        assert acme.get(f"/v1/threads/{tid}").status_code == 200
        assert globex.get("/v1/threads").json()["threads"] == []
        base = f"/v1/threads/{tid}"
        for method, path, body in [
            ("GET", base, None),
            ("PATCH", base, {"title": "x"}),
            ("GET", f"{base}/items", None),
            ("GET", f"{base}/events", None),
            ("GET", f"{base}/stream", None),
            ("POST", f"{base}/runs", {"input": "x"}),
            ("GET", f"{base}/runs/r1", None),
            ("GET", f"{base}/runs/r2", None),
            ("POST", f"{base}/runs/r2/interrupt", None),
            ("POST", f"{base}/approvals/{call_id}", {"approved": False}),
            ("DELETE", base, None),
        ]:
            response = globex.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
        # Nothing the other tenant sent reached the thread: the call still waits for its
        # owner, r2 was neither interrupted nor denied, and the title is unchanged.
        assert acme.get(f"{base}/runs/r2").json()["status"] == "running"
        decided = acme.post(f"{base}/approvals/{call_id}", json={"approved": True})
        assert decided.status_code == 202, decided.text
        assert wait_run(acme, tid, "r2")["status"] == "completed"
        items = acme.get(f"{base}/items").json()["items"]
        assert items[-1]["text"] == "word_count said: 3", items[-1]
        assert acme.get(base).json()["title"] is None
        # The same id is free in another tenant: a namespace each.
        assert globex.post("/v1/threads", json={"thread_id": "shared-name"}).status_code == 201
        assert acme.get(f"{base}/runs/r1").json()["status"] == "completed"
        assert len(acme.get("/v1/threads").json()["threads"]) == 1
    with server.client("tok-d") as default:
        assert default.get("/v1/threads").json()["threads"] == []


def test_cors_is_off_unless_configured(serve: Callable[..., Server]) -> None:
    plain = serve()
    origin = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
    with plain.client() as c:
        assert "access-control-allow-origin" not in c.get("/v1/threads", headers=origin).headers
    allowed = serve(extra_config='[server]\ncors_origins = ["https://app.example"]\n')
    with allowed.client() as c:
        response = c.get("/v1/threads", headers=origin)
        assert response.headers["access-control-allow-origin"] == "https://app.example"


def test_bad_server_table_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[server]\nmax_streems = 3\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path)
    done = subprocess.run(
        [str(RODER), "serve", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "max_streems" in done.stderr and "unknown key" in done.stderr
