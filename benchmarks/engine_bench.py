"""HTTP engines: server-sent events decoded per second, and a streamed turn's cost per delta.

Two workloads, each next to a raw baseline measured in the same run (CPU time, medians):

- E1 ``SSEDecoder.feed`` (``roder_api.enginekit``) on N events cut into chunks of 1, 16
  and 64 KiB, against the least a decoder must do: ``bytes.split`` of the whole body at
  blank lines. The decoder is linear in the chunk, so the three sizes should cost alike.
- E2 one ``stream_turn`` of N text deltas through each engine (``openai``,
  ``anthropic``) over ``httpx.MockTransport`` in 64 KiB chunks, against decoding the same
  body with ``aiter_sse`` and ``orjson.loads`` alone: what the engine adds per delta.
- E3 one streamed request to a local server (a separate process answering 30 events as a
  chat server streams them) through ``HttpxClient.stream_events``, over each wire
  (aiohttp, httpx), against the same request written and its answer read on a bare
  socket: the time to the first event (wall, what a turn waits for) and the client's CPU
  per request, taken in turn (raw, aiohttp, httpx, raw, ...).

    python benchmarks/engine_bench.py            # the table
    python benchmarks/engine_bench.py --json out.json
    python benchmarks/engine_bench.py --quick    # a short run (CI smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import orjson

from roder_anthropic import AnthropicEngine, AnthropicSettings
from roder_api.enginekit import ServerSentEvent, SSEDecoder, aiter_sse, error_failure
from roder_api.enginekit._aiohttp_wire import WIRE_ENV
from roder_api.enginekit.httpx_client import HttpxClient
from roder_api.inference import (
    AgentInferenceRequest,
    InferenceEngine,
    InferenceEvent,
    InferenceTurnContext,
    MessageDelta,
    ProviderFailure,
)
from roder_api.transcript import UserMessage
from roder_openai import EngineSettings, OpenAIResponsesEngine

CTX = InferenceTurnContext("thread_bench", "turn_1", "step_1")
REQUEST = AgentInferenceRequest(model="m", instructions=None, transcript=(UserMessage("hi"),))
KEY_ENV = "RODER_BENCH_KEY"


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def openai_body(n: int) -> bytes:
    item = {"id": "m1", "type": "message", "role": "assistant", "content": []}
    parts = [
        event(
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        )
    ]  # noqa: E501
    delta = {
        "type": "response.output_text.delta",
        "item_id": "m1",
        "output_index": 0,
        "content_index": 0,
        "delta": "word ",
    }  # noqa: E501
    parts += [
        event("response.output_text.delta", {**delta, "sequence_number": i}) for i in range(n)
    ]  # noqa: E501
    usage = {"input_tokens": 1, "output_tokens": n, "total_tokens": n + 1}
    done = {
        "type": "response.completed",
        "response": {"id": "r1", "status": "completed", "output": [], "usage": usage},
    }  # noqa: E501
    return b"".join([*parts, event("response.completed", done)])


def anthropic_body(n: int) -> bytes:
    message = {
        "id": "msg1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }  # noqa: E501
    parts = [
        event("message_start", {"type": "message_start", "message": message}),
        event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),  # noqa: E501
    ]
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "word "},
    }  # noqa: E501
    parts += [event("content_block_delta", delta)] * n
    parts += [
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": n},
            },
        ),  # noqa: E501
        event("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(parts)


def chunks_of(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def median_cpu(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)


class Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def decode(chunks: list[bytes]) -> None:
    decoder = SSEDecoder()
    for chunk in chunks:
        decoder.feed(chunk)


async def decode_json(chunks: list[bytes]) -> None:
    async for sse in aiter_sse(Body(chunks)):
        orjson.loads(sse.data)


async def turn(engine: InferenceEngine) -> None:
    async for _ in engine.stream_turn(CTX, REQUEST):
        pass


def e1(n: int, repeats: int) -> list[dict[str, Any]]:
    body = openai_body(n)
    rows = []
    for size in (1024, 16 * 1024, 64 * 1024):
        chunks = chunks_of(body, size)
        raw = median_cpu(lambda: body.split(b"\n\n"), repeats)
        kit = median_cpu(lambda chunks=chunks: decode(chunks), repeats)  # type: ignore[misc]
        rows.append({"workload": f"E1 decode, {size // 1024} KiB chunks", "events": n + 2,
                     "raw_s": raw, "roder_s": kit})  # fmt: skip
    return rows


def transport(chunks: list[bytes]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Body(chunks)
        )

    return httpx.MockTransport(handler)


async def e2(n: int, repeats: int) -> list[dict[str, Any]]:
    os.environ[KEY_ENV] = "sk-bench"
    rows = []
    for name, body in (("openai", openai_body(n)), ("anthropic", anthropic_body(n))):
        chunks = chunks_of(body, 64 * 1024)
        engine: InferenceEngine
        if name == "openai":
            table = {"base_url": "http://bench/v1", "api_key_env": KEY_ENV, "model": "m"}
            engine = OpenAIResponsesEngine(
                EngineSettings.from_table("openai", table), transport=transport(chunks)
            )
        else:
            table = {"base_url": "http://bench", "api_key_env": KEY_ENV}
            engine = AnthropicEngine(
                AnthropicSettings.from_table("anthropic", table), transport=transport(chunks)
            )

        raw_times, turn_times = [], []
        await turn(engine)  # warm: the client is made on first use
        for _ in range(repeats):  # alternate, so both see the same machine
            start = time.process_time()
            await decode_json(chunks)
            raw_times.append(time.process_time() - start)
            start = time.process_time()
            await turn(engine)
            turn_times.append(time.process_time() - start)
        await engine.aclose()
        rows.append({"workload": f"E2 {name} stream_turn", "events": n,
                     "raw_s": statistics.median(raw_times),
                     "roder_s": statistics.median(turn_times)})  # fmt: skip
    return rows


SERVER = r"""
import asyncio, sys
EVENT = b'data: {"choices": [{"delta": {"content": "word "}}]}\n\n'
BODY = EVENT * 30 + b"data: [DONE]\n\n"
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\n\r\n" % len(BODY))
async def serve(reader, writer):
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client is done with this connection
        size = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length"))
        await reader.readexactly(size)
        writer.write(HEAD + EVENT)  # the first event at once, the rest as a burst
        await writer.drain()
        writer.write(BODY[len(EVENT):])
        await writer.drain()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


class ChatState:
    """A stream state for E3: each ``data`` event is a delta until ``[DONE]``."""

    def __init__(self) -> None:
        self.finished = False
        self.failure: ProviderFailure | None = None

    def handle(self, sse: ServerSentEvent) -> list[InferenceEvent]:
        if sse.data == "[DONE]":
            self.finished = True
            return []
        return [MessageDelta(orjson.loads(sse.data)["choices"][0]["delta"]["content"])]

    def answer(self, data: Any) -> list[InferenceEvent]:
        raise AssertionError("the server streams")


def refused(status: int, headers: httpx.Headers, body: bytes, key: str | None) -> ProviderFailure:
    return error_failure(status, body[:200].decode(errors="replace"), key)


async def raw_request(port: int, stream: Any, body: bytes) -> tuple[float, float]:
    """Write the request on a kept connection, read the answer to its ``[DONE]``."""
    start, cpu = time.perf_counter(), time.process_time()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % port
    head += b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    await stream.send(head + body)
    first, seen = 0.0, b""
    while not seen.endswith(b"[DONE]\n\n"):
        seen += await stream.receive()
        if not first and b"\n\n" in seen:
            first = time.perf_counter() - start
    return first, time.process_time() - cpu


async def kit_request(client: HttpxClient, body: dict[str, Any]) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    first = 0.0
    headers = {"content-type": "application/json"}
    events = client.stream_events("chat/completions", body, headers, None, ChatState(), "[DONE]")
    async for _ in events:
        if not first:
            first = time.perf_counter() - start
    return first, time.process_time() - cpu


def start_server() -> tuple[subprocess.Popen[str], int]:
    """Start E3's server in a process of its own; return it and its port."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


async def e3(port: int, n: int) -> list[dict[str, Any]]:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    encoded = orjson.dumps(request)
    clients = {
        wire: HttpxClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=10,
                          connect_timeout=5, read_timeout=5, user_agent="bench/1",
                          status_failure=refused)
        for wire in ("aiohttp", "httpx")
    }  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {"raw": [], "aiohttp": [], "httpx": []}
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            for index in range(n + 20):  # 20 warm-up rounds
                for wire in ("raw", "aiohttp", "httpx"):
                    if wire == "raw":
                        got = await raw_request(port, stream, encoded)
                    else:
                        # The client reads the variable per request: how a user picks it.
                        os.environ[WIRE_ENV] = wire
                        got = await kit_request(clients[wire], request)
                    if index >= 20:
                        times[wire].append(got)
    finally:
        os.environ.pop(WIRE_ENV, None)
        for client in clients.values():
            await client.aclose()
    raw_first = statistics.median(t[0] for t in times["raw"])
    raw_cpu = statistics.median(t[1] for t in times["raw"])
    return [
        {"workload": f"E3 stream_events over {wire}", "events": 30, "raw_s": raw_cpu,
         "roder_s": statistics.median(t[1] for t in times[wire]),
         "raw_first_ms": raw_first * 1e3,
         "first_ms": statistics.median(t[0] for t in times[wire]) * 1e3}
        for wire in ("aiohttp", "httpx")
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    n, repeats = (500, 5) if args.quick else (20_000, 15)
    rows = e1(n, repeats) + anyio.run(e2, n // 4 if not args.quick else n, repeats)
    server, port = start_server()
    try:
        rows += anyio.run(e3, port, 50 if args.quick else 1000)
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"{'workload':<32} {'events':>7} {'raw ms':>9} {'roder ms':>9} {'µs/event':>9} {'ratio':>6}"
    )  # noqa: E501
    for row in rows:
        per_event = row["roder_s"] / row["events"] * 1e6
        row["ratio"] = row["roder_s"] / row["raw_s"] if row["raw_s"] else None
        ratio = row["ratio"] or 0.0
        print(f"{row['workload']:<32} {row['events']:>7} {row['raw_s'] * 1e3:>9.3f} "
              f"{row['roder_s'] * 1e3:>9.3f} {per_event:>9.2f} {ratio:>6.1f}")  # fmt: skip
    firsts = ", ".join(f"{row['workload'][21:]} {row['first_ms']:.3f}" for row in rows[-2:])
    print(
        f"E3 is per request; its first event came after (wall, median ms): raw socket "
        f"{rows[-1]['raw_first_ms']:.3f}, {firsts}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "quick": args.quick}, out, indent=2)


if __name__ == "__main__":
    main()
