"""The httpx half of the engine kit (``roder_api.enginekit.httpx_client``), against
``httpx.MockTransport``: what reaches the state, when the terminal events go out, and how
each failure is mapped. Both engines' loopback tests run it against a real server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from roder_api.enginekit import MAX_ERROR_BODY, ServerSentEvent, error_failure, event_json
from roder_api.enginekit.httpx_client import HttpxClient
from roder_api.inference import (
    Completed,
    InferenceEvent,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    on_request_sent,
)

pytestmark = pytest.mark.anyio
K = ProviderFailureKind
WHERE = "engine 'kit' at http://kit.test"


class Body(httpx.AsyncByteStream):
    """A streamed body that records when httpx closes it."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


class State:
    """A stream state: ``delta`` events are text, ``done`` finishes."""

    def __init__(self, body: Body | None = None, failure: ProviderFailure | None = None) -> None:
        self.finished = False
        self.failure: ProviderFailure | None = None
        self._failure = failure
        self.body = body
        self.closed_at_finish: bool | None = None
        self.answered: Any = None

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        data = event_json(sse)
        if sse.event == "done":
            self.finished = True
            self.failure = self._failure
            return [Completed(stop_reason="stop")]
        return [MessageDelta(str(data["text"]))]

    def answer(self, data: Any) -> list[InferenceEvent]:
        self.answered = data
        self.finished = True
        return [MessageDelta(str(data["text"])), Completed(stop_reason="whole")]


statuses: list[tuple[int, str, bytes, str | None]] = []


def status_failure(
    status: int, headers: httpx.Headers, body: bytes, key: str | None
) -> ProviderFailure:
    statuses.append((status, headers.get("x-test", ""), body, key))
    return error_failure(status, body[:20].decode(), key)


def kit(handler: Any) -> HttpxClient:
    return HttpxClient(
        base_url="http://kit.test/v1",
        timeout=5,
        connect_timeout=1,
        read_timeout=2,
        user_agent="kit-test/1",
        status_failure=status_failure,
        where=WHERE,
        transport=httpx.MockTransport(handler),
    )


def sse(*events: tuple[str, str]) -> list[bytes]:
    return [f"event: {name}\ndata: {data}\n\n".encode() for name, data in events]


async def collect(client: HttpxClient, state: State, key: str | None = "sk-k") -> list[Any]:
    seen: list[Any] = []
    try:
        async for event in client.stream_events("x", {"a": 1}, {"h": "1"}, key, state, "done"):
            seen.append((event, state.body.closed if state.body else None))
    finally:
        await client.aclose()
    return seen


async def test_terminal_events_go_out_after_the_body_is_closed() -> None:
    body = Body(sse(("delta", '{"text": "a"}'), ("done", "{}")))
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    seen = await collect(kit(handler), State(body))
    assert seen == [(MessageDelta("a"), False), (Completed(stop_reason="stop"), True)]
    (request,) = requests
    assert str(request.url) == "http://kit.test/v1/x" and request.content == b'{"a":1}'
    assert request.headers["h"] == "1" and request.headers["user-agent"] == "kit-test/1"


async def test_a_stream_without_its_terminal_event_is_interrupted() -> None:
    body = Body(sse(("delta", '{"text": "a"}')) + [b"event: done\ndata: {}"])  # cut event

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    state = State(body)
    with pytest.raises(ProviderFailure) as caught:
        await collect(kit(handler), state)
    assert caught.value.kind is K.STREAM_INTERRUPTED
    assert caught.value.message == "the response stream ended before done"
    assert body.closed


async def test_the_states_failure_is_raised_after_the_last_events() -> None:
    body = Body(sse(("done", "{}")))
    failure = ProviderFailure(K.CONTEXT_WINDOW_EXCEEDED, "too long")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    seen: list[InferenceEvent] = []
    client = kit(handler)
    with pytest.raises(ProviderFailure) as caught:
        async for event in client.stream_events("x", {}, {}, None, State(body, failure), "done"):
            seen.append(event)
    await client.aclose()
    assert seen == [Completed(stop_reason="stop")] and caught.value is failure


async def test_a_whole_json_answer_is_read_as_the_stream_it_stands_for() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"text": "whole"})

    state = State()
    seen = [event for event, _ in await collect(kit(handler), state)]
    assert seen == [MessageDelta("whole"), Completed(stop_reason="whole")]
    assert state.answered == {"text": "whole"}


async def test_unreadable_json_is_a_failure_of_kind_other() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=b"{")

    with pytest.raises(ProviderFailure) as caught:
        await collect(kit(handler), State())
    assert caught.value.kind is K.OTHER and "POST x with JSON" in caught.value.message


async def test_an_error_status_goes_to_the_engines_mapping_with_the_start_of_its_body() -> None:
    statuses.clear()
    big = b"overloaded " + b"x" * (2 * MAX_ERROR_BODY)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"x-test": "yes"}, content=big)

    with pytest.raises(ProviderFailure) as caught:
        await collect(kit(handler), State(), key="sk-k")
    assert caught.value.kind is K.OVERLOADED
    assert statuses == [(503, "yes", big[:MAX_ERROR_BODY], "sk-k")]
    statuses.clear()
    client = kit(handler)
    with pytest.raises(ProviderFailure):
        await client.request_json("GET", "models", None, {}, None)
    await client.aclose()
    assert statuses == [(503, "yes", big[:MAX_ERROR_BODY], None)]


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (httpx.ConnectError("refused"), K.NETWORK, "could not reach the server"),
        (httpx.ReadTimeout("slow"), K.TIMEOUT, "the request timed out"),
        (httpx.UnsupportedProtocol("gopher"), K.OTHER, "HTTP client error"),
    ],
)
async def test_transport_errors_before_the_answer(
    error: httpx.HTTPError, kind: ProviderFailureKind, said: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    for call in ("stream", "json"):
        client = kit(handler)
        with pytest.raises(ProviderFailure) as caught:
            if call == "stream":
                await collect(client, State())
            else:
                await client.request_json("GET", "models", None, {}, None)
        await client.aclose()
        assert caught.value.kind is kind
        assert caught.value.message.startswith(f"{WHERE}: {said}")


async def test_request_json_returns_the_answer_or_refuses_what_is_not_json() -> None:
    answers = [httpx.Response(200, json={"data": [1]}), httpx.Response(200, content=b"<html>")]
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers.pop(0)

    client = kit(handler)
    assert await client.request_json("POST", "c", {"b": 2}, {"k": "v"}, None) == {"data": [1]}
    with pytest.raises(ProviderFailure) as caught:
        await client.request_json("GET", "models", None, {}, None)
    await client.aclose()
    assert caught.value.kind is K.OTHER
    assert caught.value.message == "the server answered GET models with something that is not JSON"
    assert sent[0].content == b'{"b":2}' and sent[0].headers["k"] == "v" and sent[1].content == b""


async def test_the_runtime_is_told_once_the_request_body_is_on_the_wire() -> None:
    """Against a real socket (a mock transport has no wire): the server answers only once
    ``request_sent`` was called, after it has read the whole request (fails without it)."""
    log: list[str] = []
    told = anyio.Event()

    def sent() -> None:
        log.append("sent")
        told.set()

    async def serve(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            data = b""
            while not data.endswith(b'{"a":1}'):
                data += await conn.receive()
            log.append("request read")
            with anyio.fail_after(5):
                await told.wait()
            body = b'event: delta\ndata: {"text": "hi"}\n\nevent: done\ndata: {}\n\n'
            await conn.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = HttpxClient(
        base_url=f"http://127.0.0.1:{port}/v1",
        timeout=10,
        connect_timeout=5,
        read_timeout=5,
        user_agent="kit-test/1",
        status_failure=status_failure,
    )
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, serve)
        with on_request_sent(sent), anyio.fail_after(10):
            events = [e for e, _ in await collect(client, State())]
        tasks.cancel_scope.cancel()
    assert [type(e) for e in events] == [MessageDelta, Completed]
    assert sorted(log) == ["request read", "sent"]  # told once
