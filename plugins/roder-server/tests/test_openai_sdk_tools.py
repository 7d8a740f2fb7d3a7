"""The official ``openai`` SDK against a real ``roder serve``: tools that run in the server
and the usage of a retried model call.

- a Roder tool (a registered ``roder.tools`` tool: the example plugin's ``word_count``) and
  an MCP tool (a real MCP server process: ``roder-mcp``'s demo server over stdio) run
  inside a response; the SDK sees them as ``mcp_call`` items and events of its own types;
- a billed retry: an engine attempt that reports usage and then fails retryably, then an
  attempt that succeeds; the response's ``usage`` is what the turn billed (both attempts).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from serve_support import REPO, Server, journal, sdk, tool_env

pytestmark = pytest.mark.slow

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
MODEL = "scripted/scripted-1"
MCP_SERVER = REPO / "plugins" / "roder-mcp" / "tests" / "mcp_demo_server.py"

FLAKY_ENGINE = '''
"""A test engine: its first model call reports usage, then fails retryably."""
from roder_api import hookimpl
from roder_api.inference import (
    Completed, MessageDelta, ProviderFailure, ProviderFailureKind, TokenUsage, Usage,
)
from roder_api.testing import Raise, ScriptedEngine


def script(ctx, request, index):
    if index == 0:
        overloaded = ProviderFailure(ProviderFailureKind.OVERLOADED, "overloaded, try again")
        return [Usage(TokenUsage(7, 3, 10)), Raise(overloaded)]
    return [MessageDelta("recovered"), Usage(TokenUsage(11, 2, 13)), Completed("stop")]


@hookimpl
def register_inference_engines(register):
    register(ScriptedEngine(id="flaky", turns=script, models=("flaky-1",)))
'''


def strict(events: list[Any]) -> list[dict[str, Any]]:
    """Return the events as dicts after validating each against the SDK's own types, with
    strictly increasing sequence numbers."""
    out = []
    for event in events:
        data = event.to_dict()
        EVENTS.validate_python(data)
        out.append(data)
    numbers = [e["sequence_number"] for e in out]
    assert numbers == sorted(set(numbers)), numbers
    return out


def calls_in(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the ``mcp_call`` items of the final response of a stream, checked against
    the ``output_item.done`` events that carried them."""
    assert live[-1]["type"] == "response.completed", [e["type"] for e in live]
    response = Response.model_validate(live[-1]["response"])
    final = [i.to_dict() for i in response.output if i.type == "mcp_call"]
    done = [
        e["item"]
        for e in live
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call"
    ]
    assert final == done
    kinds = [e["type"] for e in live]
    for item in final:
        started = kinds.index("response.mcp_call.in_progress")
        assert "response.mcp_call.completed" in kinds[started:]
        assert item["status"] == "completed" and item["server_label"] == "roder"
    return final


def test_a_roder_tool_runs_inside_a_response(serve: Callable[..., Server], tmp_path: Path) -> None:
    server = serve(env=tool_env(tmp_path))
    client = sdk(server)
    call = 'call word_count {"text": "one two three"}'
    with client.responses.create(model=MODEL, input=call, stream=True) as stream:
        live = strict(list(stream))
    [item] = calls_in(live)
    assert item["name"] == "word_count"
    assert item["arguments"] == '{"text": "one two three"}'
    assert item["output"] == "3"
    response = Response.model_validate(live[-1]["response"])
    assert response.output_text == "word_count said: 3"
    # The same, retrieved later (from the journal), without streaming.
    fetched = client.responses.retrieve(response.id)
    assert [i.to_dict() for i in fetched.output] == [i.to_dict() for i in response.output]


def test_an_mcp_tool_runs_inside_a_response(serve: Callable[..., Server]) -> None:
    mcp = (
        "[mcp_servers.demo]\n"
        f"command = {str(sys.executable)!r}\n"
        f"args = [{str(MCP_SERVER)!r}]\n"
        "timeout_s = 30\n"
    )
    server = serve(extra_config=mcp)
    client = sdk(server)
    with client.responses.create(
        model=MODEL, input='call demo__add {"a": 2, "b": 40}', stream=True
    ) as stream:
        live = strict(list(stream))
    [item] = calls_in(live)
    assert item["name"] == "demo__add"
    assert item["output"] == "42"
    assert Response.model_validate(live[-1]["response"]).output_text == "demo__add said: 42"


def flaky_env(tmp_path: Path) -> dict[str, str]:
    """Return the environment that makes the ``flaky`` engine plugin discoverable."""
    site = tmp_path / "flaky-site"
    info = site / "roder_flaky_engine-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-flaky-engine\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[roder]\nflaky-engine = roder_flaky_engine\n")
    (site / "roder_flaky_engine.py").write_text(FLAKY_ENGINE)
    return {"PYTHONPATH": str(site)}


def test_the_usage_of_a_response_includes_a_billed_retry(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(
        env=flaky_env(tmp_path),
        top="[reliability]\nprovider_retry_initial_backoff_ms = 0\n",
    )
    client = sdk(server)
    with client.responses.create(model="flaky/flaky-1", input="hello", stream=True) as stream:
        live = strict(list(stream))
    response = Response.model_validate(live[-1]["response"])
    assert response.status == "completed"
    assert response.output_text == "recovered"
    # Both attempts: 7 + 11 input, 3 + 2 output tokens.
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (18, 5)
    assert response.usage.total_tokens == 23
    fetched = client.responses.retrieve(response.id)
    assert fetched.usage is not None and fetched.usage.to_dict() == response.usage.to_dict()

    # What the turn billed, as the journal says: the same, and it was a retry.
    assert response.conversation is not None
    with httpx.Client(base_url=server.url, timeout=30) as c:
        events = [e["event"] for e in journal(c, response.conversation.id)]
    billed = [e["usage"] for e in events if e["type"] == "usage_updated"]
    assert len(billed) == 2
    assert sum(u["total_tokens"] for u in billed) == response.usage.total_tokens
    assert any(e["type"] == "warning" for e in events)
