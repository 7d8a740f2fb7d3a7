"""What a new response writes before it streams (the SDK's time to first delta).

A response's request parameters live in its thread's ``extra``. A new conversation's
thread is created with them (its journal's first line), not created and then given them
with a metadata write of its own; a response on an existing conversation writes them
once, while its run is submitted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    [(turn_id, params)] = kept.items()
    assert response.id.endswith(turn_id)
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
