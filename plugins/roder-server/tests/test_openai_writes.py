"""What a new response writes before it streams (the SDK's time to first delta).

A response's request parameters live in its thread's ``extra``. A new conversation's
thread is created with them (its journal's first line), not created and then given them
with a metadata write of its own; a response on an existing conversation writes them
once, after its input is accepted (while the engine is called).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from serve_support import Server, sdk

pytestmark = pytest.mark.slow

MODEL = "scripted/scripted-1"


def records(home: Path, thread_id: str) -> list[dict[str, Any]]:
    """Return the records of a thread's JSONL journal, in order."""
    [path] = (home / "threads").rglob(f"{thread_id}.jsonl")
    return [orjson.loads(line)["r"] for line in path.read_bytes().splitlines()]


def test_a_new_conversation_is_created_with_the_responses_parameters(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve()
    client = sdk(server)
    response = client.responses.create(model=MODEL, input="hello", instructions="Be brief.")
    assert response.conversation is not None
    thread_id = response.conversation.id
    lines = records(tmp_path, thread_id)
    assert lines[0]["k"] == "create"
    kept = lines[0]["meta"]["extra"]["openai_responses"]
    [(turn_id, text)] = kept.items()
    assert response.id.endswith(turn_id)
    params = orjson.loads(text)
    assert params["instructions"] == "Be brief." and params["journal_after"] == 0
    assert [r["k"] for r in lines].count("meta") == 0  # no metadata write after it
    assert client.responses.retrieve(response.id).instructions == "Be brief."

    # On the same conversation: one metadata write for the second response.
    again = client.responses.create(model=MODEL, input="more", conversation=thread_id)
    lines = records(tmp_path, thread_id)
    assert [r["k"] for r in lines].count("meta") == 1
    fetched = client.responses.retrieve(again.id)
    assert fetched.output_text == "You said: more"
    assert [i.content[0].text for i in client.responses.input_items.list(again.id).data] == [  # type: ignore[union-attr]
        "more"
    ]


def test_each_response_adds_one_json_text_to_the_threads_extra(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # Every response on a conversation rewrites the thread's whole ``extra`` (and the store
    # checks it value by value): an earlier response is one value there, its defaults left
    # out, not a tree of its parameters.
    server = serve()
    client = sdk(server)
    first = client.responses.create(model=MODEL, input="one")
    assert first.conversation is not None
    thread_id = first.conversation.id
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    second = client.responses.create(
        model=MODEL, input="two", conversation=thread_id, tools=tools, metadata={"k": "v"}
    )
    [written] = [r for r in records(tmp_path, thread_id) if r["k"] == "meta"]
    entries = written["extra"]["openai_responses"]
    assert len(entries) == 2 and all(isinstance(v, str) for v in entries.values())
    plain = orjson.loads(entries[first.id.removeprefix("resp_")])
    assert set(plain) == {"model", "created_at", "journal_after"}
    fetched = client.responses.retrieve(first.id)
    assert fetched.instructions is None and fetched.tools == [] and fetched.metadata == {}
    again = client.responses.retrieve(second.id)
    assert [t.name for t in again.tools] == ["f"] and again.metadata == {"k": "v"}  # type: ignore[union-attr]


def test_parameters_kept_as_objects_by_older_threads_are_still_read(
    serve: Callable[..., Server],
) -> None:
    server = serve()
    client = sdk(server)
    response = client.responses.create(model=MODEL, input="hello", instructions="Be brief.")
    assert response.conversation is not None
    thread_id = response.conversation.id
    turn_id = response.id.removeprefix("resp_")
    old = {
        "model": MODEL,
        "instructions": "Older.",
        "previous_response_id": None,
        "tools": [],
        "background": False,
        "metadata": {"from": "before"},
        "created_at": 1,
        "journal_after": 0,
    }
    with server.client() as http:  # the extra as threads written before held it
        answer = http.patch(
            f"/v1/threads/{thread_id}", json={"extra": {"openai_responses": {turn_id: old}}}
        )
        assert answer.status_code == 200, answer.text
    fetched = client.responses.retrieve(response.id)
    assert fetched.instructions == "Older." and fetched.metadata == {"from": "before"}
    assert fetched.output_text == "You said: hello"
    client.responses.delete(response.id)
    with pytest.raises(Exception, match="no response"):
        client.responses.retrieve(response.id)


def test_an_existing_conversations_parameters_are_written_after_its_input(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # The metadata write comes once the input is accepted (while the engine is called),
    # not while the turn starts; a run refused (413) writes none.
    server = serve(top="max_input_bytes = 100\n")
    client = sdk(server)
    thread_id = client.conversations.create().id
    response = client.responses.create(model=MODEL, input="hello", conversation=thread_id)
    assert response.output_text == "You said: hello"
    kinds = [r["k"] for r in records(tmp_path, thread_id)]
    assert kinds.count("meta") == 1
    assert kinds.index("events") < kinds.index("meta")  # the turn's start came first
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model=MODEL, input="x" * 200, conversation=thread_id)
    assert refused.value.status_code == 413
    assert [r["k"] for r in records(tmp_path, thread_id)].count("meta") == 1
    assert client.responses.retrieve(response.id).output_text == "You said: hello"


def test_a_response_on_an_unknown_conversation_is_a_404_that_writes_nothing(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # Its run is submitted without a metadata read first: the session's open says 404.
    server = serve()
    client = sdk(server)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="hi", conversation="nosuchconversation")
    threads = tmp_path / "threads"
    assert not list(threads.rglob("nosuchconversation*"))  # no journal, no lease file
    assert client.conversations.create().id  # and the server goes on


def test_a_response_refused_for_a_full_queue_keeps_no_parameters(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # A 429 (the thread's queue is full) is refused before anything is written for it.
    server = serve(top="submission_queue_capacity = 1\n")
    client = sdk(server)
    thread_id = client.conversations.create().id
    long_text = " ".join(f"w{i}" for i in range(200))  # the default reply streams word by word
    accepted = [
        client.responses.create(
            model=MODEL, input=long_text, conversation=thread_id, background=True
        )
    ]
    with pytest.raises(openai.RateLimitError):
        for _ in range(3):
            accepted.append(
                client.responses.create(
                    model=MODEL, input="more", conversation=thread_id, background=True
                )
            )
    metas = [r for r in records(tmp_path, thread_id) if r["k"] == "meta"]
    assert len(metas) == len(accepted)  # one write per accepted response, none for the 429
    assert len(metas[-1]["extra"]["openai_responses"]) == len(accepted)
