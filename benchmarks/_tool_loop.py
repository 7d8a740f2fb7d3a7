"""The tool-loop workload of ``turn_bench.py``: a turn of sequential no-op tool steps.

One turn makes ``steps`` tool steps (a model step asking for one no-op tool call, then the
tool step), then answers, on the JSONL store with fsync durability. Measured: the turn's
time per tool step, and — in the same run, on the same disk — the raw cost of the durable
appends the session made (as many ``write`` + ``fdatasync`` appends as it made, each of the
journal's average append size). The runtime's own overhead per step is the difference;
the target is that it adds less than its appends cost.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from roder_api import ExtensionRegistryBuilder
from roder_api.events import TurnAborted, TurnComplete
from roder_api.inference import (
    AgentInferenceRequest,
    Completed,
    InferenceTurnContext,
    MessageDelta,
    TokenUsage,
    Usage,
)
from roder_api.testing import ScriptedEngine, ScriptStep, tool_call
from roder_api.tools import tool
from roder_api.transcript import ToolResultRecord
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, ToolsConfig, UserInput

_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


@tool(idempotent=True)
async def noop() -> str:
    """Do nothing."""
    return "ok"


def _agent(steps: int) -> Callable[[InferenceTurnContext, AgentInferenceRequest, int], Any]:
    def script(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        done = sum(1 for i in request.transcript if isinstance(i, ToolResultRecord))
        usage = Usage(TokenUsage(10, 1, 11))
        if done < steps:
            return [tool_call("noop", id=f"call_{done}"), usage, Completed("tool_calls")]
        return [MessageDelta("done"), usage, Completed("stop")]

    return script


async def tool_loop_turn(directory: Path, steps: int) -> dict[str, Any]:
    """Run one turn of ``steps`` tool steps; return its time, appends and journal bytes."""
    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine(turns=_agent(steps)))
    builder.tool(noop)
    builder.thread_store_factory(JsonlThreadStoreFactory(directory, durability="fsync"))
    config = RuntimeConfig(tools=ToolsConfig(max_tool_steps=steps + 1))
    async with Runtime(builder.build(), config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with runtime.start_session(thread_id) as session:
            await session.flush()
            before = session.recorder.batches
            start = time.perf_counter()
            await session.submit(UserInput("go"))
            while True:
                event = (await session.next_event()).event
                if isinstance(event, (TurnComplete, TurnAborted)):
                    break
            elapsed = time.perf_counter() - start
            appends = session.recorder.batches - before
    if not isinstance(event, TurnComplete):
        raise SystemExit(f"the tool-loop turn did not complete: {event!r}")
    size = await anyio.to_thread.run_sync(journal_bytes, directory)
    return {"seconds": elapsed, "appends": appends, "journal_bytes": size}


def journal_bytes(directory: Path) -> int:
    """Return the size of the journals under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*.jsonl"))


def raw_appends(directory: Path, count: int, line_bytes: int) -> float:
    """Return the seconds ``count`` durable appends of ``line_bytes`` each take."""
    line = b"x" * max(1, line_bytes - 1) + b"\n"
    path = directory / "raw-tools.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, line)
            _datasync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()


def summarize(runs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Return the medians of the runs, per tool step."""
    per_step = statistics.median(r["seconds"] for r in runs) / steps
    raw_per_step = statistics.median(r["raw_seconds"] for r in runs) / steps
    overhead = statistics.median((r["seconds"] - r["raw_seconds"]) for r in runs) / steps
    return {
        "steps": steps,
        "median_ms_per_step": per_step * 1000,
        "raw_append_ms_per_step": raw_per_step * 1000,
        "runtime_overhead_ms_per_step": overhead * 1000,
        "appends_per_step": statistics.median(r["appends"] for r in runs) / steps,
        "overhead_below_appends": overhead < raw_per_step,
        "runs": runs,
    }
