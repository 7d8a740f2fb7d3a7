"""The loopback server of ``roder_api.testing.loopback``, driven by a plain HTTP client."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

import pytest

from roder_api.testing.loopback import (
    LoopbackServer,
    Recorded,
    Reply,
    files_contain,
    roder_env,
    running_server,
)


def get(server: LoopbackServer, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("POST" if body is not None else "GET", path, body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_replies_are_queued_then_fall_back_and_requests_are_recorded() -> None:
    for server in running_server(LoopbackServer(prefix="/v1")):
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        server.expect("/a", Reply(chunks=[b"one", b"two"]), Reply(status=201, chunks=[b"x"]))
        server.always("/a", Reply(chunks=[b"always"], chunked=False))
        server.responder = lambda r: Reply(chunks=[b"made"]) if r.path == "/b" else None
        assert get(server, "/v1/a?limit=3", b'{"n": 1}') == (200, b"onetwo")
        assert get(server, "/v1/a") == (201, b"x")
        assert get(server, "/v1/a") == (200, b"always")
        assert get(server, "/v1/b") == (200, b"made")
        status, body = get(server, "/v1/c")
        assert status == 404 and b"no reply scripted for /c" in body
        assert [(r.method, r.path) for r in server.requests] == [
            ("POST", "/a"),
            ("GET", "/a"),
            ("GET", "/a"),
            ("GET", "/b"),
            ("GET", "/c"),
        ]
        (posted,) = server.posted("/a")
        assert posted.json() == {"n": 1} and posted.client_port > 0


def test_a_cut_reply_drops_the_connection_mid_body() -> None:
    for server in running_server(LoopbackServer()):
        server.expect("/s", Reply(chunks=[b"a", b"b", b"c"], cut_after=1))
        with pytest.raises(http.client.IncompleteRead):
            get(server, "/s")


def test_refused_requests_are_answered_and_fail_the_fixture() -> None:
    def check(recorded: Recorded) -> str | None:
        return "no body" if recorded.method == "POST" and not recorded.body else None

    def error_reply(status: int, message: str) -> Reply:
        return Reply(status=status, chunks=[json.dumps({"why": message}).encode()])

    fixture = running_server(LoopbackServer(check=check, error_reply=error_reply))
    server = next(fixture)
    server.expect("/m", Reply(chunks=[b"ok"]))
    assert get(server, "/m", b"") == (400, b'{"why": "no body"}')
    assert get(server, "/m", b"{}") == (200, b"ok")
    assert server.problems == ["no body"]
    with pytest.raises(AssertionError, match="refused requests"):
        next(fixture)


def test_the_roder_environment_has_only_the_test_home_and_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RODER_CONFIG", "elsewhere")
    monkeypatch.setenv("PROVIDER_KEY", "real")
    env = roder_env(tmp_path, drop=("PROVIDER_KEY",), TEST_KEY_ENV="fake")
    assert env["RODER_HOME"] == str(tmp_path) and env["TEST_KEY_ENV"] == "fake"
    assert "RODER_CONFIG" not in env and "PROVIDER_KEY" not in env
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == os.environ["PATH"]
    assert not files_contain(tmp_path, b"fake")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "f").write_bytes(b"..fake..")
    assert files_contain(tmp_path, b"fake")
