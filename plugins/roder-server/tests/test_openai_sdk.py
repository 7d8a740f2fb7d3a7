"""The official ``openai`` SDK, unchanged, against a real ``roder serve`` process.

Every stream event the server sends is validated strictly against the SDK's own
``ResponseStreamEvent`` union; a replay with ``starting_after`` is the exact suffix of the
live stream; a SIGKILLed server's response is finished by the restarted one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from serve_support import Server, sdk

pytestmark = pytest.mark.slow

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
MODEL = "scripted/scripted-1"


def strict(events: list[Any]) -> list[dict[str, Any]]:
    """Return the events as dicts after validating each against the SDK's own types."""
    out = []
    for event in events:
        data = event.to_dict()
        EVENTS.validate_python(data, strict=False)
        out.append(data)
    numbers = [e["sequence_number"] for e in out]
    assert numbers == sorted(set(numbers)), numbers
    return out


def test_create_stream_and_replay_the_exact_suffix(serve: Callable[..., Server]) -> None:
    server = serve()
    client = sdk(server)
    created = client.responses.create(model=MODEL, input="hello roder")
    assert isinstance(created, Response) and created.status == "completed"
    assert created.output_text == "You said: hello roder"
    assert created.usage is not None and created.usage.total_tokens > 0
    Response.model_validate(created.to_dict())

    with client.responses.create(model=MODEL, input="one two three four", stream=True) as stream:
        live = strict(list(stream))
    kinds = [e["type"] for e in live]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert live[0]["sequence_number"] == 0
    response_id = live[0]["response"]["id"]
    done = live[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == "You said: one two three four"

    for n in (0, 3, len(live) - 2):
        with client.responses.retrieve(response_id, stream=True, starting_after=n) as again:
            replay = strict(list(again))
        assert replay == [e for e in live if e["sequence_number"] > n]
    fetched = client.responses.retrieve(response_id)
    assert fetched.status == "completed"
    assert fetched.output_text == "You said: one two three four"
    assert fetched.to_dict() == done

    # previous_response_id continues the same thread (a conversation).
    follow = client.responses.create(model=MODEL, input="again", previous_response_id=response_id)
    assert follow.previous_response_id == response_id
    assert follow.conversation is not None
    assert follow.conversation.id == fetched.conversation.id  # type: ignore[union-attr]
    items = client.responses.input_items.list(follow.id)
    assert [i.content[0].text for i in items.data] == ["again"]  # type: ignore[union-attr]


def test_background_poll_and_cancel(serve: Callable[..., Server]) -> None:
    server = serve()
    client = sdk(server)
    queued = client.responses.create(model=MODEL, input="poll me please", background=True)
    assert queued.background is True and queued.status in ("queued", "in_progress")
    deadline = time.monotonic() + 30
    while (polled := client.responses.retrieve(queued.id)).status != "completed":
        assert time.monotonic() < deadline, polled.status
        time.sleep(0.05)
    assert polled.output_text == "You said: poll me please"

    long_text = " ".join(f"w{i}" for i in range(300))  # 20 ms a word: about 6 s
    running = client.responses.create(model=MODEL, input=long_text, background=True)
    time.sleep(0.3)
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status in ("cancelled", "incomplete")
    assert client.responses.cancel(running.id).status == cancelled.status  # idempotent
    assert client.responses.retrieve(running.id).status == cancelled.status


def test_conversations_items_models_and_errors(serve: Callable[..., Server]) -> None:
    server = serve(env={"RODER_SERVER_TOKENS": "tok-1"})
    client = sdk(server, "tok-1")
    conversation = client.conversations.create(metadata={"topic": "weather"})
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "weather"}
    client.conversations.update(conversation.id, metadata={"topic": "rain"})
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "rain"}
    first = client.responses.create(model=MODEL, input="first", conversation=conversation.id)
    client.responses.create(model=MODEL, input="second", conversation=conversation.id)
    assert first.conversation is not None and first.conversation.id == conversation.id
    listed = client.conversations.items.list(conversation.id)
    texts = [part.text for item in listed.data for part in item.content]  # type: ignore[union-attr]
    assert texts == ["first", "You said: first", "second", "You said: second"]

    models = [m.id for m in client.models.list()]
    assert MODEL in models

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nothing.r123")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=[{"role": "assistant", "content": "no"}])
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "wrong").models.list()
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_async_client_streams(serve: Callable[..., Server]) -> None:
    server = serve()

    async def main() -> list[dict[str, Any]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        stream = await client.responses.create(model=MODEL, input="async hello", stream=True)
        events = [e async for e in stream]
        await client.close()
        return strict(events)

    events = anyio.run(main)
    assert events[-1]["type"] == "response.completed"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "You said: async hello"


@pytest.mark.parametrize("backend", ["jsonl", "postgres"])
def test_a_sigkilled_stream_is_finished_from_the_journal(
    serve: Callable[..., Server], backend: str
) -> None:
    server = serve(backend)
    client = sdk(server)
    long_text = " ".join(f"w{i}" for i in range(200))
    got: list[dict[str, Any]] = []
    with client.responses.create(model=MODEL, input=long_text, stream=True) as stream:
        for event in stream:
            got.append(event.to_dict())
            if len(got) == 12:
                break
    server.kill()
    server.start()
    last = got[-1]["sequence_number"]
    with client_for(server).responses.retrieve(
        got[0]["response"]["id"], stream=True, starting_after=last
    ) as rest:
        tail = strict(list(rest))
    assert tail[0]["sequence_number"] == last + 1, "a gap or a duplicate"
    assert tail[-1]["type"] in ("response.incomplete", "response.failed", "response.completed")
    whole = strict_dicts(got + tail)
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))


def client_for(server: Server) -> openai.OpenAI:
    return sdk(server)


def strict_dicts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for data in events:
        EVENTS.validate_python(data)
    return events


def test_a_function_tool_round_trip(serve: Callable[..., Server]) -> None:
    server = serve()
    client = sdk(server)
    weather = {
        "type": "function",
        "name": "weather",
        "description": "Return the weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    asked = client.responses.create(
        model=MODEL,
        input='call weather {"city": "Oslo"}',
        tools=[weather],  # type: ignore[list-item]
    )
    assert asked.status == "completed"
    calls = [item for item in asked.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [("weather", '{"city": "Oslo"}')]
    Response.model_validate(asked.to_dict())
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        tools=[weather],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
    )
    assert answer.output_text == "weather said: sunny"
    with pytest.raises(openai.BadRequestError, match="already answered|is not open"):
        client.responses.create(
            model=MODEL,
            previous_response_id=answer.id,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "x"}],
        )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def katan() -> Iterator[str]:
    """llm-katan (echo backend: no model weights), started once; yield its ``/v1`` URL."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    command = shutil.which("llm-katan", path=str(Path(sys.executable).parent))
    if command is None:
        pytest.skip("llm-katan is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [command, "-m", "tiny-echo", "--backend", "echo", "--providers", "openai"]
        + ["-h", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "llm-katan did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def _behind_katan(
    serve: Callable[..., Server], katan: str, env: dict[str, str] | None = None
) -> Server:
    return serve(
        extra_config=(f'[engines.openai-chat]\nbase_url = "{katan}"\napi_key_env = "KATAN_KEY"\n'),
        env={"KATAN_KEY": "local", **(env or {})},
    )


def test_a_real_chat_completions_server_behind_roder_serve(
    serve: Callable[..., Server], katan: str
) -> None:
    """llm-katan as the openai-chat engine's server."""
    client = sdk(_behind_katan(serve, katan))
    with client.responses.create(
        model="openai-chat/tiny-echo", input="hello katan", stream=True
    ) as stream:
        events = strict(list(stream))
    assert events[-1]["type"] == "response.completed", events[-1]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert "echo" in text and text == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert events[-1]["response"]["model"] == "openai-chat/tiny-echo"
    usage = events[-1]["response"]["usage"]
    assert usage is not None and usage["total_tokens"] > 0
    # ``instructions`` reach the engine: llm-katan's echo counts the messages it got
    # (a system message more) and bills their words.
    plain = client.responses.create(model="openai-chat/tiny-echo", input="hello katan")
    told = client.responses.create(
        model="openai-chat/tiny-echo", input="hello katan", instructions="answer in five words"
    )
    assert "messages=1 " in plain.output_text, plain.output_text
    assert "messages=2 " in told.output_text, told.output_text
    assert told.instructions == "answer in five words"
    assert plain.usage is not None and told.usage is not None
    assert told.usage.input_tokens == plain.usage.input_tokens + 4


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/maps")
@pytest.mark.parametrize("wire", ["", "httpx"])
def test_the_engine_sends_over_aiohttp_unless_told_httpx(
    serve: Callable[..., Server], katan: str, wire: str
) -> None:
    """The installed ``roder serve`` (asyncio's uvloop) sends the engine's requests over
    aiohttp: its extension is mapped into the process once the first engine request was
    made, and not before (nothing else in the server imports it); with
    ``RODER_ENGINE_HTTP=httpx`` it never is, and both answer the same."""
    server = _behind_katan(serve, katan, {"RODER_ENGINE_HTTP": wire} if wire else None)
    assert server.proc is not None
    maps = Path(f"/proc/{server.proc.pid}/maps")
    assert "/aiohttp/" not in maps.read_text()
    answer = sdk(server).responses.create(model="openai-chat/tiny-echo", input="hello katan")
    assert "echo" in answer.output_text and answer.status == "completed"
    assert ("/aiohttp/" in maps.read_text()) is (wire == "")


def test_a_sigkilled_stream_is_finished_by_another_server_on_postgres(
    serve: Callable[..., Server], tmp_path: Any
) -> None:
    first = serve("postgres")
    schema = first.config.read_text().split('schema = "')[1].split('"')[0]
    second_home = tmp_path / "second"
    second_home.mkdir()
    second = serve("postgres", schema=schema, home=second_home)
    long_text = " ".join(f"w{i}" for i in range(200))
    got: list[dict[str, Any]] = []
    with sdk(first).responses.create(model=MODEL, input=long_text, stream=True) as stream:
        for event in stream:
            got.append(event.to_dict())
            if len(got) == 15:
                break
    first.kill()
    last = got[-1]["sequence_number"]
    with sdk(second).responses.retrieve(
        got[0]["response"]["id"], stream=True, starting_after=last
    ) as rest:
        tail = strict(list(rest))
    assert tail[0]["sequence_number"] == last + 1, "a gap or a duplicate"
    assert tail[-1]["type"] in ("response.incomplete", "response.failed")
    whole = strict_dicts(got + tail)
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))


def test_another_tenants_responses_and_conversations_are_not_found(
    serve: Callable[..., Server],
) -> None:
    server = serve(env={"RODER_SERVER_TOKENS": "tok-a=acme,tok-b=globex"})
    acme, globex = sdk(server, "tok-a"), sdk(server, "tok-b")
    response = acme.responses.create(model=MODEL, input="acme only")
    assert response.conversation is not None
    conversation = response.conversation.id
    for attempt in (
        lambda: globex.responses.retrieve(response.id),
        lambda: globex.responses.input_items.list(response.id),
        lambda: globex.responses.cancel(response.id),
        lambda: globex.conversations.retrieve(conversation),
        lambda: globex.conversations.items.list(conversation),
        lambda: globex.responses.create(model=MODEL, input="x", conversation=conversation),
        lambda: globex.responses.create(model=MODEL, input="x", previous_response_id=response.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert acme.responses.retrieve(response.id).output_text == "You said: acme only"
    assert [i.type for i in acme.conversations.items.list(conversation).data] == [
        "message",
        "message",
    ]


def test_concurrent_responses_on_one_conversation_are_all_kept(
    serve: Callable[..., Server],
) -> None:
    server = serve()
    client = sdk(server)
    conversation = client.conversations.create().id
    ids: list[str] = []

    async def main() -> None:
        async_client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x")

        async def one(n: int) -> None:
            created = await async_client.responses.create(
                model=MODEL, input=f"n{n}", conversation=conversation, background=True
            )
            ids.append(created.id)

        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(one, n)
        await async_client.close()

    anyio.run(main)
    deadline = time.monotonic() + 60
    for response_id in ids:
        while (got := client.responses.retrieve(response_id)).status != "completed":
            assert time.monotonic() < deadline, got.status
            time.sleep(0.05)
        assert got.model == MODEL and got.background, "its parameters were not kept"
    assert len(set(ids)) == 8
    deleted = client.responses.delete(ids[0])
    assert deleted is None  # the SDK returns nothing for a delete
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[1]).status == "completed"
