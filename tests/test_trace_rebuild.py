"""Traces rebuilt from the journal: the span tree of a turn, and a SIGKILLed turn's error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import Raise, ScriptedEngine, tool_call
from roder_api.tools import tool
from roder_api.tracing import NOT_ENDED, otlp_json, rebuild_traces, span_tree
from roder_runtime import ReliabilityConfig, RuntimeConfig

from .conftest import REPO, make_runtime, roder_command

pytestmark = [pytest.mark.anyio, pytest.mark.core]


@tool
def lookup(q: str) -> str:
    """Look a word up.

    Args:
        q: the word
    """
    return f"found {q}"


def _engine() -> ScriptedEngine:
    return ScriptedEngine(
        models=("gpt-4o",),
        turns=[
            [
                Usage(TokenUsage(100, 0, 100)),
                Raise(ProviderFailure(ProviderFailureKind.NETWORK, "reset")),
            ],
            [
                MessageDelta("let me look"),
                tool_call("lookup", {"q": "otel"}),
                Usage(TokenUsage(120, 10, 130, 20)),
                Completed(),
            ],
            [
                MessageDelta("it is "),
                MessageDelta("tracing"),
                Usage(TokenUsage(150, 5, 155)),
                Completed(),
            ],
        ],
    )


def _config() -> RuntimeConfig:
    return RuntimeConfig(
        default_model="gpt-4o",
        reliability=ReliabilityConfig(provider_retry_initial_backoff_ms=0),
    )


async def run_traced_turn(base: Path) -> tuple[str, list]:  # type: ignore[type-arg]
    """Run one turn with a retried failure and a tool call; return the thread and journal."""
    from roder_api.extension import ExtensionRegistryBuilder
    from roder_jsonl_thread_store import JsonlThreadStoreFactory
    from roder_runtime import Runtime

    builder = ExtensionRegistryBuilder().inference_engine(_engine()).tool(lookup)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=base))
    async with Runtime(builder.build(), _config()) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "what is otel?") == "it is tracing"
        events = await (await runtime.journal(thread_id)).read_events()
    return thread_id, events


async def test_a_turn_rebuilds_into_the_genai_span_tree(tmp_path: Path) -> None:
    thread_id, events = await run_traced_turn(tmp_path / "threads")
    (trace,) = rebuild_traces(thread_id, events)
    names = [s.name for s in trace.spans]
    assert names == [
        "invoke_agent roder",
        "chat gpt-4o",
        "chat gpt-4o",
        "execute_tool lookup",
        "chat gpt-4o",
    ]
    root = trace.root
    assert root.parent_span_id is None and root.error is None
    assert all(s.parent_span_id == root.span_id for s in trace.spans[1:])
    assert root.attributes["gen_ai.conversation.id"] == thread_id
    assert root.attributes["gen_ai.usage.input_tokens"] == 370
    failed, tool_step, call, answer = trace.spans[1:]
    assert failed.error is not None and "attempt 1 of 3 failed" in failed.error
    assert failed.attributes["gen_ai.usage.input_tokens"] == 100  # the failed attempt, billed
    assert tool_step.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert tool_step.attributes["gen_ai.usage.cache_read.input_tokens"] == 20
    assert tool_step.attributes["gen_ai.provider.name"] == "scripted"
    assert tool_step.attributes["gen_ai.request.model"] == "gpt-4o"
    assert "gen_ai.response.time_to_first_chunk" in tool_step.attributes
    assert call.attributes["gen_ai.tool.name"] == "lookup"
    assert call.attributes["gen_ai.tool.call.id"] == "call_lookup"
    assert "gen_ai.tool.call.arguments" not in call.attributes  # content is opt-in
    assert answer.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert "gen_ai.output.messages" not in answer.attributes
    assert all(s.start_ms <= s.end_ms for s in trace.spans)
    assert all(root.start_ms <= s.start_ms and s.end_ms <= root.end_ms for s in trace.spans)
    (with_content,) = rebuild_traces(thread_id, events, capture_content=True)
    assert "tracing" in str(with_content.spans[-1].attributes["gen_ai.output.messages"])
    assert "what is otel?" in str(with_content.root.attributes["gen_ai.input.messages"])
    print(span_tree(trace))


CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import AssistantContentDelta
    from roder_api.inference import MessageDelta, TokenUsage, Usage
    from roder_api.testing import Hang, ScriptedEngine
    from roder_runtime import UserInput
    from tests.conftest import make_runtime

    async def main(base, thread_id):
        script = [Usage(TokenUsage(10, 0, 10)), MessageDelta("streamed so far"), Hang()]
        engine = ScriptedEngine(turns=[script])
        async with make_runtime(base, engine) as runtime:
            async with await runtime.start_session(thread_id) as session:
                turn_id = await session.submit(UserInput("will be cut off"))
                while True:
                    event = (await session.next_event()).event
                    if isinstance(event, AssistantContentDelta):
                        break
                print(turn_id, flush=True)
                await anyio.sleep_forever()

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


async def test_a_sigkilled_turn_traces_with_an_error(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    base = tmp_path / "threads"
    async with make_runtime(base) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
    async with await anyio.open_process(
        [sys.executable, "-c", CHILD, str(base), thread_id], cwd=REPO
    ) as child:
        assert child.stdout is not None
        output = b""
        with anyio.fail_after(60):
            while not output.endswith(b"\n"):
                output += await child.stdout.receive()
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    turn_id = output.decode().strip()
    env = {**cli_env, "RODER_THREADS_PATH": str(base)}
    out = tmp_path / "trace.json"
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*roder_command(), "threads", "trace", thread_id, "-o", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert done.returncode == 0, done.stderr
    assert "1 turns (2 spans)" in done.stdout
    document = json.loads(out.read_text())
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["name"] for s in spans] == ["invoke_agent roder", "chat scripted-default"]
    assert all(s["status"] == {"code": 2, "message": NOT_ENDED} for s in spans)
    root, chat = spans
    assert chat["parentSpanId"] == root["spanId"] and "parentSpanId" not in root
    assert int(chat["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
    assert {"key": "roder.turn_id", "value": {"stringValue": turn_id}} in root["attributes"]


async def test_otlp_json_carries_ids_times_and_status(tmp_path: Path) -> None:
    thread_id, events = await run_traced_turn(tmp_path / "threads")
    traces = rebuild_traces(thread_id, events)
    spans = otlp_json(traces)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len({s["traceId"] for s in spans}) == 1 and len(spans[0]["traceId"]) == 32
    assert len({s["spanId"] for s in spans}) == len(spans)
    assert spans[1]["status"]["code"] == 2 and spans[0]["status"] == {"code": 1}
    first = next(e for e in events if e.sequence == 1)
    assert spans[0]["startTimeUnixNano"] == str(first.recorded_at_ms * 1_000_000)
