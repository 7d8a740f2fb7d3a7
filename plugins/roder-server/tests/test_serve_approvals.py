"""Approvals over HTTP: from any connection, from another worker, and after a restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from serve_support import ASK, CALL, Server, tool_env, wait_asked, wait_run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", ["1", "2"])
def test_approve_over_http(serve: Callable[..., Server], tmp_path: Path, workers: str) -> None:
    server = serve("sqlite", env=tool_env(tmp_path), extra_config=ASK, args=("--workers", workers))
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        c.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r1"})
        asked = wait_asked(c, tid)
        # Any connection (with two workers: often the one not holding the thread).
        with httpx.Client(base_url=server.url, timeout=30) as other:
            decided = other.post(
                f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True}
            )
        assert decided.status_code == 202, decided.text
        assert wait_run(c, tid, "r1")["status"] == "completed"
        again = c.post(f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True})
        assert again.status_code == 409
        items = c.get(f"/v1/threads/{tid}/items").json()["items"]
        assert items[-1] == {"type": "assistant_message", "text": "word_count said: 3"} | {
            k: v for k, v in items[-1].items() if k not in ("type", "text")
        }


def test_a_pending_approval_survives_a_restart(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve("jsonl", env=tool_env(tmp_path), extra_config=ASK)
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        c.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r1"})
        asked = wait_asked(c, tid)
    server.kill()
    server.start()
    with server.client() as c:
        # The restarted server resumes the turn (its sweep); the resumed session asks again.
        wait_asked(c, tid, count=2)
        decided = c.post(f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True})
        assert decided.status_code == 202, decided.text
        assert wait_run(c, tid, "r1")["status"] == "completed"
        texts = [i.get("text") for i in c.get(f"/v1/threads/{tid}/items").json()["items"]]
        assert texts[-1] == "word_count said: 3"


def test_a_later_turn_reusing_a_call_id_is_asked_and_answered_again(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # The scripted engine names each turn's first call the same: an old turn's decision
    # must not answer (or block) the new question.
    server = serve("jsonl", env=tool_env(tmp_path), extra_config=ASK)
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        for number, turn in enumerate(("r1", "r2"), start=1):
            c.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": turn})
            asked = wait_asked(c, tid, count=number)
            assert asked["turn_id"] == turn
            decided = c.post(
                f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True}
            )
            assert decided.status_code == 202, decided.text
            assert wait_run(c, tid, turn)["status"] == "completed"
        again = c.post(f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True})
        assert again.status_code == 409
