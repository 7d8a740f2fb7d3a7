"""What a response writes: its request parameters once, with its turn's input in the journal.

They used to live in the thread's ``extra``, where every response on a conversation
rewrote every earlier response's entry: a conversation of n responses wrote O(n^2) bytes
(the JSONL journal appended the whole ``extra`` again for each one) and each response's
write grew. Now a conversation's responses never write its metadata; each response's
parameters are the ``metadata`` of its turn's first event (``TurnStarted``, or
``InputAccepted`` when the input waited).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from serve_support import Server, sdk

pytestmark = pytest.mark.slow

MODEL = "scripted/scripted-1"
TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


def journal(home: Path, thread_id: str) -> Path:
    [path] = (home / "threads").rglob(f"{thread_id}.jsonl")
    return path


def records(home: Path, thread_id: str) -> list[dict[str, Any]]:
    """Return the records of a thread's JSONL journal, in order."""
    return [orjson.loads(line)["r"] for line in journal(home, thread_id).read_bytes().splitlines()]


def events(home: Path, thread_id: str) -> list[dict[str, Any]]:
    """Return every journaled event of a thread (the JSONL ``events`` records' events)."""
    return [e for r in records(home, thread_id) if r["k"] == "events" for e in r["events"]]


def test_a_conversations_responses_never_rewrite_its_metadata(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve()
    client = sdk(server)
    thread_id = client.conversations.create().id
    sizes = [journal(tmp_path, thread_id).stat().st_size]
    responses = []
    for i in range(12):
        responses.append(
            client.responses.create(
                model=MODEL, input="again", conversation=thread_id, tools=TOOLS, metadata={"i": i}
            )
        )
        sizes.append(journal(tmp_path, thread_id).stat().st_size)
    kinds = [r["k"] for r in records(tmp_path, thread_id)]
    assert kinds.count("meta") == 0  # no metadata write per response
    growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert max(growth) - min(growth) < 64, growth  # the same per response, not growing
    starts = [e for e in events(tmp_path, thread_id) if e["type"] == "turn_started"]
    assert len(starts) == 12
    for response, start in zip(responses, starts, strict=True):
        assert response.id == f"resp_{start['turn_id']}"
        kept = start["metadata"]["openai_response"]
        assert kept["model"] == MODEL and kept["tools"] == TOOLS
    for i, response in enumerate(responses):  # each read back with its own parameters
        fetched = client.responses.retrieve(response.id)
        assert fetched.metadata == {"i": i} and [t.name for t in fetched.tools] == ["f"]  # type: ignore[union-attr]
        assert fetched.output_text == "You said: again"


def test_a_new_conversation_is_created_without_parameters(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve()
    client = sdk(server)
    response = client.responses.create(model=MODEL, input="hello", instructions="Be brief.")
    assert response.conversation is not None
    lines = records(tmp_path, response.conversation.id)
    assert lines[0]["k"] == "create" and "openai_responses" not in lines[0]["meta"]["extra"]
    [start] = [e for e in events(tmp_path, response.conversation.id) if e["type"] == "turn_started"]
    assert start["metadata"]["openai_response"]["instructions"] == "Be brief."
    assert client.responses.retrieve(response.id).instructions == "Be brief."


def test_an_early_response_is_found_far_back_in_a_long_conversation(
    serve: Callable[..., Server],
) -> None:
    # Found by paging back through the journal (no index of responses is written).
    server = serve()
    client = sdk(server)
    first = client.responses.create(model=MODEL, input="first", metadata={"n": "1"})
    assert first.conversation is not None
    thread_id = first.conversation.id
    items = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(300)]
    client.conversations.items.create(thread_id, items=items)  # type: ignore[arg-type]
    later = client.responses.create(model=MODEL, input="later", conversation=thread_id)
    fetched = client.responses.retrieve(first.id)
    assert fetched.output_text == "You said: first" and fetched.metadata == {"n": "1"}
    assert client.responses.retrieve(later.id).output_text.endswith("later")
    text = "".join(
        e.delta
        for e in client.responses.retrieve(first.id, stream=True, starting_after=0)
        if e.type == "response.output_text.delta"
    )
    assert text == "You said: first"
    client.responses.delete(first.id)
    with pytest.raises(Exception, match="no response"):
        client.responses.retrieve(first.id)
    assert client.responses.retrieve(later.id).output_text.endswith("later")


def test_the_parameters_are_kept_without_their_defaults(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve()
    client = sdk(server)
    plain = client.responses.create(model=MODEL, input="one")
    assert plain.conversation is not None
    [start] = [e for e in events(tmp_path, plain.conversation.id) if e["type"] == "turn_started"]
    assert set(start["metadata"]["openai_response"]) == {"model", "created_at"}
    fetched = client.responses.retrieve(plain.id)
    assert fetched.instructions is None and fetched.tools == [] and fetched.metadata == {}
    assert [i.content[0].text for i in client.responses.input_items.list(plain.id).data] == [  # type: ignore[union-attr]
        "one"
    ]


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


def test_a_refused_response_writes_nothing(serve: Callable[..., Server], tmp_path: Path) -> None:
    # A run refused (413: over max_input_bytes, which the parameters count towards) is
    # refused before anything is journaled for it.
    server = serve(top="max_input_bytes = 200\n")
    client = sdk(server)
    thread_id = client.conversations.create().id
    response = client.responses.create(model=MODEL, input="hello", conversation=thread_id)
    assert response.output_text == "You said: hello"
    size = journal(tmp_path, thread_id).stat().st_size
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model=MODEL, input="x" * 300, conversation=thread_id)
    assert refused.value.status_code == 413
    big = [{"type": "function", "name": "f", "description": "d" * 300}]
    with pytest.raises(openai.APIStatusError) as refused:  # the text fits, its tools do not
        client.responses.create(model=MODEL, input="hi", conversation=thread_id, tools=big)  # type: ignore[list-item]
    assert refused.value.status_code == 413
    assert journal(tmp_path, thread_id).stat().st_size == size
    assert client.responses.retrieve(response.id).output_text == "You said: hello"


def test_a_response_refused_for_a_full_queue_keeps_no_parameters(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # A 429 (the thread's queue is full) is refused before anything is written for it; a
    # response queued behind a running one carries its parameters on its InputAccepted.
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
        for i in range(3):
            accepted.append(
                client.responses.create(
                    model=MODEL,
                    input="more",
                    conversation=thread_id,
                    background=True,
                    metadata={"i": str(i)},
                )
            )
    deadline = time.monotonic() + 60
    for response in accepted:
        while client.responses.retrieve(response.id).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline, f"{response.id} never ended"
            time.sleep(0.05)
    carried = [e for e in events(tmp_path, thread_id) if e.get("metadata")]
    assert [e["turn_id"] for e in carried] == [r.id.removeprefix("resp_") for r in accepted]
    assert [r["k"] for r in records(tmp_path, thread_id)].count("meta") == 0
    # The second waited behind the first (the queue holds one): its InputAccepted has them.
    assert len(accepted) == 2 and carried[1]["type"] == "input_accepted"
    fetched = client.responses.retrieve(accepted[1].id)
    assert fetched.metadata == {"i": "0"} and fetched.output_text == "You said: more"


def test_two_servers_write_responses_on_one_conversation_at_once(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # Two `roder serve` processes on one store: A holds the conversation's session, B
    # journals its responses' input (with their parameters) for A to answer. Written at
    # the same moment from both, every response keeps its own parameters (the old extra
    # entries could overwrite each other) and reads back the same from either server.
    a = serve()
    (tmp_path / "b").mkdir()
    b = serve(home=tmp_path / "b", store_home=tmp_path)
    by = {"a": sdk(a), "b": sdk(b)}
    first = by["a"].responses.create(model=MODEL, input="start")
    assert first.conversation is not None
    thread_id = first.conversation.id

    def create(name: str, i: int) -> Any:
        return by[name].responses.create(
            model=MODEL, input=f"{name}{i}", conversation=thread_id, metadata={"by": name}
        )

    with ThreadPoolExecutor(6) as pool:
        made = list(pool.map(create, ["a", "b"] * 3, [0, 0, 1, 1, 2, 2]))
    assert a.lease_holder_pid(thread_id) == a.worker_pids()[0]  # B's were answered by A
    carried = [e for e in events(tmp_path, thread_id) if e.get("metadata")]
    assert len(carried) == 7 and any(e["type"] == "input_accepted" for e in carried)
    assert [r["k"] for r in records(tmp_path, thread_id)].count("meta") == 0
    for response in made:
        name = response.metadata["by"]
        for client in by.values():
            fetched = client.responses.retrieve(response.id)
            assert fetched.metadata == {"by": name}
            assert fetched.output_text == f"You said: {name}{response.output_text[-1]}"
