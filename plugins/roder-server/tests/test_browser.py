"""The thread browser at ``/`` in headless Chromium against a real ``roder serve``: the
thread list, a transcript, the live stream, a run started from the input box, approve and
deny, a token, and a server killed and restarted during a run (the page shows the whole
turn without a reload)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import (
    APPROVAL_CONFIG,
    free_port,
    launch,
    page_state,
    tool_plugin_env,
    transcript,
)
from serve_support import Server, journal, wait_run

pytestmark = pytest.mark.slow

WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[str], Any]]:
    """Return a function that opens a new page at a URL; fail on any script error."""
    contexts: list[Any] = []
    errors: list[str] = []

    def open_at(url: str) -> Any:
        context = browser.new_context()
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        return page

    yield open_at
    for context in contexts:
        context.close()
    assert not errors, f"script errors on the page: {errors}"


def _items(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(c, t) for c, t in rows if c.split()[0] == "item"]


def _run(c: httpx.Client, tid: str, text: str, turn_id: str) -> None:
    response = c.post(f"/v1/threads/{tid}/runs", json={"input": text, "turn_id": turn_id})
    assert response.status_code == 202, response.text
    assert wait_run(c, tid, turn_id)["status"] == "completed"


def test_thread_list_newest_first_and_transcript(
    serve: Callable[..., Server], open_page: Callable[[str], Any]
) -> None:
    server = serve()
    with server.client() as c:
        alpha = c.post("/v1/threads", json={}).json()["thread_id"]
        _run(c, alpha, "first question alpha", "a1")
        _run(c, alpha, "follow up alpha", "a2")
        beta = c.post("/v1/threads", json={"title": "Beta"}).json()["thread_id"]
        _run(c, beta, "question beta", "b1")
    page = open_page(server.url + "/")
    page.wait_for_function(
        "[...document.querySelectorAll('#threads .first-prompt')]"
        ".map(n => n.textContent).join('|') === 'question beta|first question alpha'"
    )
    order = page.eval_on_selector_all("#threads li", "ns => ns.map(n => n.dataset.threadId)")
    assert order == [beta, alpha]
    assert page.inner_text(f"#threads li[data-thread-id='{beta}'] .title") == "Beta"

    page.click(f"#threads li[data-thread-id='{alpha}'] a")
    page.wait_for_selector("#stream-state[data-state='live']")
    assert transcript(page) == [
        ("item user", "first question alpha"),
        ("item assistant", "You said: first question alpha"),
        ("item user", "follow up alpha"),
        ("item assistant", "You said: follow up alpha"),
    ]
    assert page.inner_text("#thread-title") == alpha

    # A link to a thread opens it directly.
    linked = open_page(f"{server.url}/#/threads/{beta}")
    linked.wait_for_selector("#stream-state[data-state='live']")
    assert linked.inner_text("#thread-title") == "Beta"
    assert _items(transcript(linked)) == [
        ("item user", "question beta"),
        ("item assistant", "You said: question beta"),
    ]
    # An unknown thread says so.
    missing = open_page(f"{server.url}/#/threads/no-such-thread")
    missing.wait_for_selector("#notice:not([hidden])")
    assert "No thread no-such-thread" in missing.inner_text("#notice")


def test_live_stream_and_a_run_from_the_input_box(
    serve: Callable[..., Server], open_page: Callable[[str], Any]
) -> None:
    server = serve()
    page = open_page(server.url + "/")
    page.click("#new-thread")
    page.wait_for_function("location.hash.startsWith('#/threads/')")
    page.wait_for_selector("#stream-state[data-state='live']")
    tid = page_state(page)["threadId"]
    words = " ".join(f"w{i}" for i in range(80))  # ~1.6 s of deltas at 20 ms a word
    page.fill("#run-input", words)
    page.press("#run-input", "Enter")
    # Deltas appear as they are journaled: a partial reply first ...
    partial = page.wait_for_selector("#transcript .item.live")
    page.wait_for_function(
        "document.querySelector('#transcript .item.live')?.textContent.includes('w10')"
    )
    seen = partial.text_content() or ""
    assert seen.startswith("You said: w0") and not seen.endswith("w79")
    # ... then the completed message takes its place.
    page.wait_for_selector("#thread-pane[data-running='false'] #transcript .item.assistant")
    assert transcript(page) == [("item user", words), ("item assistant", f"You said: {words}")]
    assert page.input_value("#run-input") == ""
    # The new thread is listed with its first prompt.
    page.wait_for_selector(f"#threads li[data-thread-id='{tid}'] .first-prompt:text('w0 w1')")

    # A run another client starts shows up live too.
    with server.client() as c:
        response = c.post(f"/v1/threads/{tid}/runs", json={"input": "from curl", "turn_id": "x"})
        assert response.status_code == 202
        wait_run(c, tid, "x")
        events = journal(c, tid)
    page.wait_for_selector("#transcript .item.assistant:text('You said: from curl')")
    state = page_state(page)
    assert state["sequences"] == list(range(1, len(events) + 1))
    assert state["duplicates"] == 0 and state["gaps"] == 0


def test_approve_and_deny_a_tool_call(
    serve: Callable[..., Server], open_page: Callable[[str], Any], tmp_path: Path
) -> None:
    server = serve(env=tool_plugin_env(tmp_path / "site"), extra_config=APPROVAL_CONFIG)
    page = open_page(server.url + "/")
    page.click("#new-thread")
    page.wait_for_selector("#stream-state[data-state='live']")
    tid = page_state(page)["threadId"]
    page.fill("#run-input", 'call word_count {"text": "one two three"}')
    page.click("#run-send")
    card = page.wait_for_selector(".approval button.approve")
    assert 'word_count({"text": "one two three"})' in page.inner_text(".approval .question")
    card.click()
    page.wait_for_selector(".approval.decided .decision:text('approved')")
    page.wait_for_selector("#transcript .item.assistant:text('word_count said: 3')")
    assert page.query_selector(".approval button") is None

    # An approval asked before the page opened is answerable from a new page (on another
    # thread: the server keys approvals by call id, and the scripted engine names every
    # first call of a turn call_1_word_count).
    with server.client() as c:
        other = c.post("/v1/threads", json={}).json()["thread_id"]
        response = c.post(
            f"/v1/threads/{other}/runs",
            json={"input": 'call word_count {"text": "a b"}', "turn_id": "t2"},
        )
        assert response.status_code == 202
        later = open_page(f"{server.url}/#/threads/{other}")
        later.wait_for_selector(".approval:not(.decided) button.deny").click()
        later.wait_for_selector(".approval.decided .decision:text('denied')")
        assert wait_run(c, other, "t2")["status"] == "completed"
        later.wait_for_selector("#transcript .item.tool-result.error")
        # A second page on the same thread sees the decision live: no buttons left.
        assert later.query_selector(".approval button") is None
        events = journal(c, tid) + journal(c, other)
    decisions = [e["event"] for e in events if e["event"]["type"] == "tool_approval_decided"]
    assert [d["approved"] for d in decisions] == [True, False]
    results = [
        e["event"]["item"]
        for e in events
        if e["event"]["type"] == "item_completed" and e["event"]["item"]["type"] == "tool_result"
    ]
    assert results[0]["result"] == "3" and not results[0]["is_error"]
    assert results[1]["is_error"] and "did not run" in results[1]["result"]


def test_a_token_from_the_page(
    serve: Callable[..., Server], open_page: Callable[[str], Any]
) -> None:
    server = serve(env={"RODER_SERVER_TOKENS": "tok-browser"})
    with server.client("tok-browser") as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        _run(c, tid, "secret question", "s1")
        probe = c.get(
            f"/v1/threads/{tid}/stream",
            params={"access_token": "tok-browser", "until": "turn_end"},
            headers={"Authorization": ""},
        )
    with server.client() as anonymous:
        # The page's files hold no data and are open; every data route still wants a token.
        assert anonymous.get("/static/browser.js").status_code == 200
        assert anonymous.get("/").status_code == 200
        assert anonymous.get("/v1/threads").status_code == 401
        wrong = anonymous.get(f"/v1/threads/{tid}/stream", params={"access_token": "nope"})
        assert wrong.status_code == 401
        # access_token is taken on streams only.
        assert (
            anonymous.get("/v1/threads", params={"access_token": "tok-browser"}).status_code == 401
        )
    assert probe.status_code == 200, probe.text
    page = open_page(server.url + "/")
    page.wait_for_selector("#notice:text('needs a token')")
    assert page.query_selector("#threads li") is None
    page.fill("#token", "tok-browser")
    page.click("#token-form button")
    page.wait_for_selector("#threads .first-prompt:text('secret question')")
    page.click(f"#threads li[data-thread-id='{tid}'] a")
    page.wait_for_selector("#stream-state[data-state='live']")
    page.fill("#run-input", "with a token")
    page.press("#run-input", "Enter")
    page.wait_for_selector("#transcript .item.assistant:text('You said: with a token')")
    # The token is kept for the tab only, and survives a reload.
    page.reload()
    page.wait_for_selector("#threads .first-prompt:text('secret question')")


def test_server_restart_during_a_run(
    serve: Callable[..., Server], open_page: Callable[[str], Any]
) -> None:
    # The same port after the restart: the page's EventSource reconnects by itself.
    server = serve(args=("--port", str(free_port())))
    with server.client() as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
        _run(c, tid, "before the run", "r0")
        opened_at = len(journal(c, tid))
    page = open_page(f"{server.url}/#/threads/{tid}")
    page.wait_for_selector("#stream-state[data-state='live']")
    long = " ".join(f"w{i}" for i in range(150))  # ~3 s at 20 ms a word
    page.fill("#run-input", long)
    page.press("#run-input", "Enter")
    page.wait_for_function(
        "document.querySelector('#transcript .item.live')?.textContent.includes('w10')"
    )
    page.fill("#run-input", "after the restart")
    page.press("#run-input", "Enter")
    page.wait_for_selector("#transcript .item.queued:text('after the restart')")
    server.kill()
    page.wait_for_selector("#stream-state[data-state='reconnecting']")
    server.start()
    page.wait_for_selector("#transcript .item.assistant:text('You said: after the restart')")
    page.wait_for_selector("#thread-pane[data-running='false']")
    with server.client() as c:
        events = journal(c, tid)
    kinds = [e["event"]["type"] for e in events]
    assert kinds.count("turn_aborted") == 1, kinds  # the killed turn, closed after the restart
    state = page_state(page)
    assert state["lastSequence"] == len(events)
    assert state["sequences"] == list(range(opened_at + 1, len(events) + 1))
    assert state["duplicates"] == 0 and state["gaps"] == 0
    shown = transcript(page)
    assert [t for c, t in shown if c == "note aborted"] == ["turn aborted: process_exited"]
    # The live page shows what a fresh load shows, nothing twice and nothing missing.
    fresh = open_page(f"{server.url}/#/threads/{tid}")
    fresh.wait_for_selector("#stream-state[data-state='live']")
    assert _items(shown) == _items(transcript(fresh))
    assert [t for c, t in _items(shown) if c == "item user"] == [
        "before the run",
        long,
        "after the restart",
    ]
