"""The response every SSE route of ``roder serve`` returns: it streams in the request's task.

Starlette's ``StreamingResponse`` (under ASGI spec < 2.4, which uvicorn declares) starts
the stream in a new task and listens for the client's disconnect in the request's: the
status line, the headers and the first chunk then wait for one pass of the event loop,
behind every callback ready at that moment (under a turn's engine stream: its deltas'
decoding, the next append), ~0.5 ms of a response's time to first delta measured on
``openai_bench``. :class:`EventStream` swaps the two: the request's task streams at once
and a child task listens for the disconnect, which cancels the stream as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""The headers of every event stream: never cached, never buffered by a proxy."""


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response whose first bytes go out without a loop pass.

    ``content`` is an async iterator of encoded chunks (each sent as one write); the
    headers are :data:`SSE_HEADERS` and any ``headers`` given. A client
    that disconnects cancels the iteration (its ``finally`` runs), as with Starlette's.
    """

    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterable[bytes], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(content, headers={**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the body in this task; a child task ends it on ``http.disconnect``."""
        spec = scope.get("asgi", {}).get("spec_version", "2.0")
        if scope["type"] != "http" or tuple(map(int, spec.split("."))) >= (2, 4):
            await super().__call__(scope, receive, send)  # no listener needed there
            return
        error: Exception | None = None
        async with anyio.create_task_group() as task_group:

            async def watch() -> None:
                await self.listen_for_disconnect(receive)
                task_group.cancel_scope.cancel()

            task_group.start_soon(watch)
            try:
                await self.stream_response(send)
            except Exception as exc:  # raised as itself below, not in an ExceptionGroup
                error = exc
            finally:
                task_group.cancel_scope.cancel()
        if error is not None:
            raise error
