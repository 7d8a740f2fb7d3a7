"""Journaled turns, projected as Responses API events, checked against the openai SDK's types."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from roder_api import ExtensionRegistryBuilder
from roder_api.events import JournalEvent
from roder_api.inference import Completed, MessageDelta, ReasoningDelta, TokenUsage, Usage
from roder_api.testing import ScriptedEngine
from roder_api.tools import tool
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_server.openai._projection import ResponseProjection, turn_id_of

pytestmark = pytest.mark.anyio


def _event_classes() -> dict[str, Any]:
    """Return the SDK's stream event class for each ``type`` (the union's members)."""
    union = typing.get_args(ResponseStreamEvent)[0]
    classes = {}
    for cls in typing.get_args(union):
        (literal,) = typing.get_args(cls.model_fields["type"].annotation)
        classes[literal] = cls
    return classes


EVENT_CLASSES = _event_classes()


@tool
def lookup(word: str) -> str:
    """Return what a word means."""
    return f"{word} means ten"


def runtime(path: Path, engine: ScriptedEngine) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    builder.tool(lookup)
    return Runtime(builder.build(), RuntimeConfig())


async def journal_of_one_turn(rt: Runtime, text: str) -> tuple[str, str, list[JournalEvent]]:
    thread_id = (await rt.create_thread()).thread_id
    await rt.run_turn(thread_id, text, turn_id="turn_one")
    page = await rt.event_page(thread_id, limit=10_000)
    return thread_id, "turn_one", list(page.events)


def project(
    thread_id: str, turn_id: str, events: list[JournalEvent], **kw: Any
) -> list[dict[str, Any]]:
    projection = ResponseProjection(thread_id, turn_id, "scripted/scripted-1", **kw)
    out = projection.feed_all(events)
    assert projection.done
    return out


def check_stream(out: list[dict[str, Any]]) -> None:
    for event in out:
        EVENT_CLASSES[event["type"]].model_validate(event)  # the SDK's own types, strictly
    numbers = [e["sequence_number"] for e in out]
    assert numbers == list(range(len(out))), "sequence numbers count up from 0, no gap"


async def test_a_text_turn_is_a_well_formed_response(tmp_path: Path) -> None:
    engine = ScriptedEngine(
        turns=[
            [
                ReasoningDelta("thinking "),
                ReasoningDelta("hard"),
                MessageDelta("Hel"),
                MessageDelta("lo"),
                Usage(TokenUsage(10, 2, 12, 4)),
                Completed("stop"),
            ]
        ]
    )
    async with runtime(tmp_path, engine) as rt:
        thread_id, turn_id, journal = await journal_of_one_turn(rt, "hi")
    out = project(thread_id, turn_id, journal)
    check_stream(out)
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in out if e["type"] == "response.output_text.delta")
    assert text == "Hello"
    final = Response.model_validate(out[-1]["response"])
    assert final.id == "resp_turn_one" and turn_id_of(final.id) == "turn_one"
    assert final.output_text == "Hello"
    assert final.usage is not None and final.usage.total_tokens == 12
    assert final.usage.input_tokens_details.cached_tokens == 4
    assert [o.type for o in final.output] == ["reasoning", "message"]


async def test_replaying_is_the_exact_suffix_of_the_live_stream(tmp_path: Path) -> None:
    async with runtime(tmp_path, ScriptedEngine()) as rt:
        thread_id, turn_id, journal = await journal_of_one_turn(rt, 'call lookup {"word": "x"}')
    live = project(thread_id, turn_id, journal, client_tools=frozenset())
    again = project(thread_id, turn_id, journal, client_tools=frozenset())
    assert live == again, "the projection is deterministic"
    for cut in range(0, len(live), 3):
        # Live delivery in pieces (any split of the journal) gives the same events.
        projection = ResponseProjection(thread_id, turn_id, "scripted/scripted-1")
        pieces = projection.feed_all(journal[:cut]) + projection.feed_all(journal[cut:])
        assert pieces == live


async def test_roder_tools_are_mcp_calls_and_client_tools_function_calls(tmp_path: Path) -> None:
    async with runtime(tmp_path, ScriptedEngine()) as rt:
        thread_id, turn_id, journal = await journal_of_one_turn(rt, 'call lookup {"word": "x"}')
    served = project(thread_id, turn_id, journal)
    check_stream(served)
    final = Response.model_validate(served[-1]["response"])
    (call,) = [o for o in final.output if o.type == "mcp_call"]
    assert call.name == "lookup" and call.output == "x means ten" and call.server_label == "roder"
    assert "response.mcp_call.completed" in [e["type"] for e in served]
    # Seen as a client tool, the same call is a function_call item the client answers.
    client = project(thread_id, turn_id, journal, client_tools=frozenset({"lookup"}))
    check_stream(client)
    final = Response.model_validate(client[-1]["response"])
    (fc,) = [o for o in final.output if o.type == "function_call"]
    assert fc.call_id.endswith("lookup") and json.loads(fc.arguments) == {"word": "x"}


async def test_an_interrupted_or_failed_turn_ends_the_stream_honestly(tmp_path: Path) -> None:
    from roder_api.inference import ProviderFailure, ProviderFailureKind
    from roder_api.testing._scripted import Raise

    failure = ProviderFailure(ProviderFailureKind.INVALID_REQUEST, "no such model")
    engine = ScriptedEngine(turns=[[MessageDelta("part"), Raise(failure)]])
    async with runtime(tmp_path, engine) as rt:
        thread_id, turn_id, journal = await journal_of_one_turn(rt, "hi")
    out = project(thread_id, turn_id, journal)
    check_stream(out)
    assert out[-1]["type"] == "response.failed"
    final = Response.model_validate(out[-1]["response"])
    assert final.status == "failed" and final.error is not None
    assert "no such model" in final.error.message
