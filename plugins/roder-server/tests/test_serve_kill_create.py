"""SIGKILL ``roder serve`` while the official SDK opens new conversations, one after another
(each response creates its thread, takes its lease and journals its input as its session
opens): every response the SDK was given survives with its input and is answered after the
restart, no conversation is made twice, the JSONL store checks clean (``roder fsck``), and
the restarted server takes new conversations at once (JSONL, SQLite, PostgreSQL)."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Callable

import openai
import pytest
from serve_support import RODER, Server, sdk, wait_for

pytestmark = pytest.mark.slow

MODEL = "scripted/scripted-1"
KILLS = 3


def _open_conversations(
    client: openai.OpenAI, given: list[tuple[str, str]], stop: threading.Event
) -> None:
    """Create background responses, each on a new conversation, until the server dies."""
    count = 0
    while not stop.is_set():
        text = f"conversation {len(given)} {count}"
        try:
            response = client.responses.create(model=MODEL, input=text, background=True)
        except (openai.APIConnectionError, openai.InternalServerError):
            return  # the server was killed under this request: it was never given
        given.append((response.id, text))
        count += 1


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_sigkill_while_new_conversations_are_opened(
    serve: Callable[..., Server], backend: str
) -> None:
    server = serve(backend)
    rng = random.Random(7)
    given: list[tuple[str, str]] = []
    for _ in range(KILLS):
        before = len(given)
        stop = threading.Event()
        opener = threading.Thread(
            target=_open_conversations, args=(sdk(server), given, stop), daemon=True
        )
        opener.start()
        wait_for(lambda n=before: len(given) >= n + 5, "five new conversations")
        time.sleep(rng.uniform(0.0, 0.05))  # somewhere in a later create
        server.kill()
        stop.set()
        opener.join(30)
        assert not opener.is_alive()
        if backend == "jsonl":
            checked = subprocess.run(
                [str(RODER), "--config", str(server.config), "fsck"],
                capture_output=True,
                text=True,
                env=server.env,
                timeout=120,
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
        server.start()
    client = sdk(server)
    assert len(given) >= 5 * KILLS
    for response_id, text in given:
        # Every response the SDK was given survives: its input, and an answer (the turns
        # running when the server died, often most of them, are aborted by the crash
        # rules and answered as failed or cancelled).
        items = client.responses.input_items.list(response_id).data
        assert [i.content[0].text for i in items] == [text]  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while (status := client.responses.retrieve(response_id).status) in (
            "queued",
            "in_progress",
        ):
            assert time.monotonic() < deadline, f"{response_id} still {status}"
            time.sleep(0.05)
        assert status in ("completed", "failed", "cancelled", "incomplete"), status
    with server.client() as c:
        threads = c.get("/v1/threads", params={"limit": 1000}).json()["threads"]
    # One thread per response, and at most one more per kill: the conversation whose
    # create the kill cut (its response never given), made at most once.
    assert len(given) <= len(threads) <= len(given) + KILLS
    after = client.responses.create(model=MODEL, input="after the kills")
    assert after.status == "completed"
    assert "after the kills" in after.output_text
