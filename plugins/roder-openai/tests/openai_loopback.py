"""The loopback server of the engine tests (``roder_api.testing.loopback``), driven by
fixture files written from OpenAI's documented wire format.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from roder_api.testing.loopback import LoopbackServer as BaseLoopbackServer
from roder_api.testing.loopback import Recorded, Reply
from roder_api.testing.loopback import running_server as running

__all__ = [
    "FIXTURES",
    "KEY_ENV",
    "TEST_KEY",
    "LoopbackServer",
    "Recorded",
    "Reply",
    "fixture_bytes",
    "json_reply",
    "running_server",
    "sse_events",
    "sse_reply",
]

FIXTURES = Path(__file__).parent / "fixtures"

TEST_KEY = "sk-loopback-test-key-do-not-leak-0123456789"
"""The key the tests hand the engines; it must never show up in errors or the store."""

KEY_ENV = "RODER_TEST_OPENAI_KEY"
"""The environment variable that carries :data:`TEST_KEY`."""


def fixture_bytes(name: str) -> bytes:
    """Return a fixture file's bytes."""
    return (FIXTURES / name).read_bytes()


def sse_events(name: str) -> list[bytes]:
    """Return a ``.sse`` fixture split into its events, each ending in a blank line."""
    text = fixture_bytes(name).replace(b"\r\n", b"\n")
    return [block.strip(b"\n") + b"\n\n" for block in text.split(b"\n\n") if block.strip(b"\n")]


def sse_reply(name: str, **kwargs: Any) -> Reply:
    """Return a streamed reply of a ``.sse`` fixture, one event per chunk."""
    return Reply(headers={"content-type": "text/event-stream"}, chunks=sse_events(name), **kwargs)


def json_reply(name: str, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """Return a JSON reply of a fixture file."""
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        chunks=[fixture_bytes(name)],
        chunked=False,
    )


class LoopbackServer(BaseLoopbackServer):
    """The loopback server under ``/v1``, as OpenAI's API is (paths recorded without it)."""

    def __init__(self) -> None:
        super().__init__(prefix="/v1")


def running_server() -> Iterator[LoopbackServer]:
    """Yield a started server, stopped afterwards (a fixture body)."""
    yield from running(LoopbackServer())
