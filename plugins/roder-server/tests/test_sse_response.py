"""``EventStream``: the first bytes go out in the request's task (no event-loop pass before
them), a disconnect still ends the stream, and a failing body raises its own exception."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.responses import StreamingResponse
from starlette.types import Message

from roder_server._sse_response import EventStream

SCOPE: dict[str, Any] = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "GET"}


class _Ticker:
    """Counts the event loop's passes while it runs (one checkpoint per pass)."""

    def __init__(self) -> None:
        self.passes = 0

    async def run(self) -> None:
        while True:
            await anyio.lowlevel.checkpoint()
            self.passes += 1


async def _first_bytes_after(response_class: type[StreamingResponse]) -> tuple[int, list[str]]:
    """Return how many loop passes ran before the first chunk was sent, and what was sent."""
    ticker = _Ticker()
    sent: list[str] = []
    at_first_chunk: list[int] = []
    done = anyio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"event: a\ndata: {}\n\n"
        await done.wait()

    async def send(message: Message) -> None:
        sent.append(message["type"])
        if message["type"] == "http.response.body" and message.get("body"):
            at_first_chunk.append(ticker.passes)
            done.set()

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(ticker.run)
            await anyio.lowlevel.checkpoint()  # the ticker is running
            start = ticker.passes
            if response_class is EventStream:
                response: StreamingResponse = EventStream(body())
            else:
                response = StreamingResponse(body(), media_type="text/event-stream")
            await response(SCOPE, receive, send)
            task_group.cancel_scope.cancel()
    return at_first_chunk[0] - start, sent


@pytest.mark.anyio
async def test_the_first_chunk_goes_out_without_a_loop_pass(anyio_backend: str) -> None:
    passes, sent = await _first_bytes_after(EventStream)
    assert passes == 0
    assert sent == ["http.response.start", "http.response.body", "http.response.body"]
    if anyio_backend == "asyncio":  # trio runs a new task in the batch it was made in
        # Starlette's own waits for a pass first (its stream runs in a new task): the
        # cost this class removes.
        starlette_passes, _ = await _first_bytes_after(StreamingResponse)
        assert starlette_passes >= 1


@pytest.mark.anyio
async def test_a_disconnect_ends_the_stream(anyio_backend: str) -> None:
    finished = anyio.Event()
    disconnect = anyio.Event()
    sent: list[Message] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            disconnect.set()
            await anyio.sleep_forever()
            yield b"never"
        finally:
            finished.set()

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    with anyio.fail_after(5):
        await EventStream(body())(SCOPE, receive, send)
    assert finished.is_set()
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"data: 1\n\n"]
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-store"


@pytest.mark.anyio
async def test_a_failing_body_raises_its_own_error(anyio_backend: str) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise LookupError("the store went away")

    async def send(message: Message) -> None:
        pass

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(5), pytest.raises(LookupError, match="went away"):
        await EventStream(body())(SCOPE, receive, send)


@pytest.mark.anyio
async def test_spec_2_4_servers_get_starlettes_path(anyio_backend: str) -> None:
    sent: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"

    async def send(message: Message) -> None:
        sent.append(message["type"])

    async def receive() -> Message:
        raise AssertionError("a spec 2.4 server reports a disconnect on send, never here")

    scope = {**SCOPE, "asgi": {"spec_version": "2.4"}}
    with anyio.fail_after(5):
        await EventStream(body())(scope, receive, send)
    assert sent == ["http.response.start", "http.response.body", "http.response.body"]
