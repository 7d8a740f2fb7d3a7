"""HTTP engines: server-sent events decoded per second, and a streamed turn's cost per delta.

Two workloads, each next to a raw baseline measured in the same run (CPU time, medians):

- E1 ``SSEDecoder.feed`` (``roder_api.enginekit``) on N events cut into chunks of 1, 16
  and 64 KiB, against the least a decoder must do: ``bytes.split`` of the whole body at
  blank lines. The decoder is linear in the chunk, so the three sizes should cost alike.
- E2 one ``stream_turn`` of N text deltas through each engine (``openai``,
  ``anthropic``) over ``httpx.MockTransport`` in 64 KiB chunks, against decoding the same
  body with ``aiter_sse`` and ``orjson.loads`` alone: what the engine adds per delta.

    python benchmarks/engine_bench.py            # the table
    python benchmarks/engine_bench.py --json out.json
    python benchmarks/engine_bench.py --quick    # a short run (CI smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import orjson

from roder_anthropic import AnthropicEngine, AnthropicSettings
from roder_api.enginekit import SSEDecoder, aiter_sse
from roder_api.inference import AgentInferenceRequest, InferenceEngine, InferenceTurnContext
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    n, repeats = (500, 5) if args.quick else (20_000, 15)
    rows = e1(n, repeats) + anyio.run(e2, n // 4 if not args.quick else n, repeats)
    print(
        f"{'workload':<32} {'events':>7} {'raw ms':>9} {'roder ms':>9} {'µs/event':>9} {'ratio':>6}"
    )  # noqa: E501
    for row in rows:
        per_event = row["roder_s"] / row["events"] * 1e6
        row["ratio"] = row["roder_s"] / row["raw_s"] if row["raw_s"] else None
        ratio = row["ratio"] or 0.0
        print(f"{row['workload']:<32} {row['events']:>7} {row['raw_s'] * 1e3:>9.1f} "
              f"{row['roder_s'] * 1e3:>9.1f} {per_event:>9.2f} {ratio:>6.1f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "quick": args.quick}, out, indent=2)


if __name__ == "__main__":
    main()
