"""A real HTTP server on 127.0.0.1 that speaks the Messages API wire format, strictly.

The server is ``roder_api.testing.loopback``'s (HTTP/1.1 from a thread, every request
recorded, body pieces flushed one at a time). Every request body is checked against the
``anthropic`` SDK's request types, and every event and JSON answer it is given to send is
checked against the SDK's models before the test runs: a drift from the real format fails
the test (``problems`` collects what the server refused).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from anthropic_wire import (
    WireError,
    check_error,
    check_event,
    check_message,
    check_request,
)

from roder_api.testing.loopback import LoopbackServer as BaseLoopbackServer
from roder_api.testing.loopback import Recorded, Reply
from roder_api.testing.loopback import running_server as running

TEST_KEY = "sk-ant-loopback-test-key-do-not-leak-0123456789"
"""The key the tests hand the engine; it must never show up in errors or the store."""

KEY_ENV = "RODER_TEST_ANTHROPIC_KEY"
"""The environment variable that carries :data:`TEST_KEY`."""


def sse_reply(events: Sequence[Mapping[str, Any]], **kwargs: Any) -> Reply:
    """Return a streamed reply of ``events`` (each checked against the SDK), one per chunk."""
    chunks = []
    for event in events:
        check_event(event)
        data = json.dumps(event, ensure_ascii=False)
        chunks.append(f"event: {event['type']}\ndata: {data}\n\n".encode())
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks, **kwargs)


def json_reply(data: Mapping[str, Any], status: int = 200, **headers: str) -> Reply:
    """Return a JSON reply: a message (2xx, checked) or an error body (checked)."""
    if status < 300:
        check_message(data)
    else:
        check_error(data)
    return Reply(
        status=status,
        headers={"content-type": "application/json", **headers},
        chunks=[json.dumps(data).encode()],
    )


def error_reply(status: int, kind: str, message: str, **headers: str) -> Reply:
    """Return an Anthropic error answer."""
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}
    return json_reply(body, status, **headers)


def _check(recorded: Recorded) -> str | None:
    """Return why the Messages API would refuse a request (None: it would not)."""
    if recorded.method != "POST" or recorded.path != "/v1/messages":
        return None
    if "anthropic-version" not in recorded.headers:
        return "no anthropic-version header"
    try:
        body = recorded.json()
        check_request(body, stream=bool(body.get("stream")))
    except (WireError, ValueError, AttributeError) as error:
        return f"request refused: {error}"
    return None


def _error_reply(status: int, message: str) -> Reply:
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return error_reply(status, kind, message)


class LoopbackServer(BaseLoopbackServer):
    """The loopback server, checking every ``POST /v1/messages`` against the SDK's types.

    Its base URL has no ``/v1``, as the API's has not; paths are recorded whole.
    """

    def __init__(self) -> None:
        super().__init__(check=_check, error_reply=_error_reply)

    def posted(self, path: str = "/v1/messages") -> list[Recorded]:
        """Return the POST requests made to ``path`` (``/v1/messages``), in order."""
        return super().posted(path)


def running_server() -> Iterator[LoopbackServer]:
    """Yield a started server, stopped afterwards; fail on anything it refused."""
    yield from running(LoopbackServer())


# --- wire-format builders ----------------------------------------------------------------


def usage(
    input_tokens: int = 12, output_tokens: int = 1, read: int = 0, created: int = 0
) -> dict[str, Any]:
    """Return a ``usage`` object as ``message_start`` carries it."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    }


def message_start(msg_id: str = "msg_loopback_1", **usage_kwargs: int) -> dict[str, Any]:
    """Return a ``message_start`` event."""
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(**usage_kwargs),
        },
    }


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    """Return the events of one streamed text block."""
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        }
    ]
    for piece in pieces:
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": piece},
            }
        )
    events.append({"type": "content_block_stop", "index": index})
    return events


def thinking_block(index: int, text: str, signature: str) -> list[dict[str, Any]]:
    """Return the events of one streamed thinking block with its signature."""
    start = {"type": "thinking", "thinking": "", "signature": ""}
    half = len(text) // 2
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text[:half]},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text[half:]},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        },
        {"type": "content_block_stop", "index": index},
    ]


def redacted_block(index: int, data: str) -> list[dict[str, Any]]:
    """Return the events of a redacted thinking block (it comes whole in its start)."""
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "redacted_thinking", "data": data},
        },
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, call_id: str, name: str, *parts: str) -> list[dict[str, Any]]:
    """Return the events of a tool use whose input streams as ``input_json_delta`` parts."""
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
        }
    ]
    for part in parts:
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
        )
    events.append({"type": "content_block_stop", "index": index})
    return events


def compaction_block(index: int, summary: str, **fields: Any) -> list[dict[str, Any]]:
    """Return the events of a ``compaction`` block: start, one whole delta, stop."""
    start: dict[str, Any] = {"type": "compaction", "content": None}
    delta: dict[str, Any] = {"type": "compaction_delta", "content": summary}
    delta.update(fields)
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


def message_end(
    stop_reason: str = "end_turn", output_tokens: int = 9, **extra_usage: Any
) -> list[dict[str, Any]]:
    """Return ``message_delta`` (stop reason, final usage) and ``message_stop``."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **extra_usage},
        },
        {"type": "message_stop"},
    ]


def ping() -> dict[str, Any]:
    """Return a ``ping`` event."""
    return {"type": "ping"}


def text_stream(*pieces: str, **usage_kwargs: int) -> list[dict[str, Any]]:
    """Return a whole stream that answers with text (a greeting by default)."""
    return [
        message_start(**usage_kwargs),
        ping(),
        *text_block(0, *(pieces or ("Hello", " from loopback."))),
        *message_end(),
    ]
