"""Approvals over HTTP: from any connection, from another worker, and after a restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from serve_support import ASK, CALL, Server, journal, tool_env, wait_asked, wait_for, wait_run

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


def _two_servers(
    serve: Callable[..., Server], tmp_path: Path, backend: str
) -> tuple[Server, Server]:
    """Two separate ``roder serve`` processes on one store (the approval config on both)."""
    env = tool_env(tmp_path)
    first = serve(backend, env=env, extra_config=ASK)
    schema = None
    if backend == "postgres":
        schema = first.config.read_text().split('schema = "')[1].split('"')[0]
    home = tmp_path / "second"
    home.mkdir()
    second = serve(
        backend, env=env, extra_config=ASK, schema=schema, home=home, store_home=tmp_path
    )
    return first, second


def _decided(c: httpx.Client, thread_id: str, call_id: str, turn_id: str) -> int:
    return sum(
        1
        for e in journal(c, thread_id)
        if e["event"]["type"] == "tool_approval_decided"
        and (e["event"]["call_id"], e["event"]["turn_id"]) == (call_id, turn_id)
    )


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_an_approval_posted_to_the_process_not_running_the_turn(
    serve: Callable[..., Server], tmp_path: Path, backend: str
) -> None:
    """The turn waits for its approval in server A (it holds the lease); the approval is
    POSTed to server B; then again after A is SIGKILLed and restarted, through whichever
    server does not hold the resumed turn."""
    a, b = _two_servers(serve, tmp_path, backend)
    with a.client() as ca, b.client() as cb:
        tid = ca.post("/v1/threads", json={}).json()["thread_id"]
        assert ca.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r1"}).is_success
        asked = wait_asked(cb, tid)
        assert a.lease_holder_pid(tid) == a.worker_pids()[0], "the turn is not running in A"
        decided = cb.post(
            f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True}
        )
        assert decided.status_code == 202, decided.text
        assert wait_run(cb, tid, "r1")["status"] == "completed"
        assert _decided(cb, tid, asked["call_id"], "r1") == 1
        assert cb.get(f"/v1/threads/{tid}/items").json()["items"][-1]["text"] == (
            "word_count said: 3"
        )
        # Again with A killed while the turn waits, and restarted.
        assert ca.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r2"}).is_success
        asked = wait_asked(cb, tid, count=2)
        assert asked["turn_id"] == "r2"
        wait_for(lambda: a.lease_holder_pid(tid) == a.worker_pids()[0], "A to hold r2")
    a.kill()
    a.start()
    with a.client() as ca, b.client() as cb:
        # The resumed turn (in A, or in B's sweep) asks again.
        asked = wait_asked(cb, tid, count=3)
        pids = {a.worker_pids()[0]: b, b.worker_pids()[0]: a}
        wait_for(lambda: a.lease_holder_pid(tid) in pids, "a server to hold the resumed turn")
        other = pids[a.lease_holder_pid(tid)]  # type: ignore[index]
        with other.client() as co:
            decided = co.post(
                f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True}
            )
        assert decided.status_code == 202, decided.text
        assert wait_run(ca, tid, "r2")["status"] == "completed"
        assert _decided(ca, tid, asked["call_id"], "r2") == 1
        texts = [i.get("text") for i in ca.get(f"/v1/threads/{tid}/items").json()["items"]]
        assert texts[-1] == "word_count said: 3"


@pytest.mark.parametrize("backend", ["jsonl", "postgres"])
def test_an_approval_posted_while_the_process_running_the_turn_is_dead(
    serve: Callable[..., Server], tmp_path: Path, backend: str
) -> None:
    """Server A runs the turn, waiting for its approval, and is SIGKILLed; the approval is
    POSTed to server B before anyone resumed the turn. The decision (202) is not lost: the
    turn resumes and completes without asking again."""
    a, b = _two_servers(serve, tmp_path, backend)
    with a.client() as ca, b.client() as cb:
        tid = ca.post("/v1/threads", json={}).json()["thread_id"]
        assert ca.post(f"/v1/threads/{tid}/runs", json={"input": CALL, "turn_id": "r1"}).is_success
        asked = wait_asked(cb, tid)
        a.kill()
        decided = cb.post(
            f"/v1/threads/{tid}/approvals/{asked['call_id']}", json={"approved": True}
        )
        assert decided.status_code == 202, decided.text
        assert wait_run(cb, tid, "r1")["status"] == "completed"
        texts = [i.get("text") for i in cb.get(f"/v1/threads/{tid}/items").json()["items"]]
        assert texts[-1] == "word_count said: 3"
