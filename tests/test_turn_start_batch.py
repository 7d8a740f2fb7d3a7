"""A turn's start, its input and its first model step's start are one durable append.

The first streamed delta is persisted before it is delivered; a ``ModelStepStarted``
journaled on its own just before the model call made that delta wait behind one more
append (the OpenAI surface's time to first delta). Nothing can come between the turn's
start and the first call unless a compaction or a budget check does; then the step's
start is journaled as before, right before the call.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.inference import (
    Completed,
    MessageDelta,
    ProviderFailure,
    ProviderFailureKind,
    TokenUsage,
    Usage,
)
from roder_api.testing import Raise, ScriptedEngine
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import BudgetConfig, ReliabilityConfig, Runtime, RuntimeConfig

pytestmark = pytest.mark.anyio


def journal_lines(path: Path) -> list[list[str]]:
    """Return each ``events`` line of a JSONL journal (one append each) as event types."""
    lines = []
    for raw in path.read_bytes().splitlines():
        record = orjson.loads(raw)["r"]
        if record["k"] == "events":
            lines.append([event["type"] for event in record["events"]])
    return lines


async def run_one_turn(tmp_path: Path, engine: ScriptedEngine, config: RuntimeConfig) -> Path:
    builder = ExtensionRegistryBuilder().inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    runtime = Runtime(builder.build(), config)
    try:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "hello")
    finally:
        await runtime.aclose()
    [path] = (tmp_path / "threads").rglob(f"{thread_id}.jsonl")
    return path


async def test_the_first_step_starts_in_the_turns_first_append(tmp_path: Path) -> None:
    path = await run_one_turn(tmp_path, ScriptedEngine(), RuntimeConfig())
    lines = journal_lines(path)
    # The first append opens with them (an instant scripted reply may share it: nothing
    # waits for the start to be persisted before the model call).
    assert lines[0][:3] == ["turn_started", "item_completed", "model_step_started"]
    assert sum(line.count("model_step_started") for line in lines) == 1


async def test_a_retried_attempt_journals_a_step_start_of_its_own(tmp_path: Path) -> None:
    failure = ProviderFailure(ProviderFailureKind.OVERLOADED, "overloaded")
    engine = ScriptedEngine(
        turns=[
            [Usage(TokenUsage(3, 1, 4)), Raise(failure)],
            [MessageDelta("ok"), Usage(TokenUsage(3, 1, 4)), Completed("stop")],
        ]
    )
    config = RuntimeConfig(reliability=ReliabilityConfig(provider_retry_initial_backoff_ms=0))
    path = await run_one_turn(tmp_path, engine, config)
    lines = journal_lines(path)
    assert lines[0][:3] == ["turn_started", "item_completed", "model_step_started"]
    events = [kind for line in lines for kind in line]
    assert events.count("model_step_started") == 2
    steps = [
        event["model_step_id"]
        for raw in path.read_bytes().splitlines()
        for event in orjson.loads(raw)["r"].get("events", ())
        if event["type"] == "model_step_started"
    ]
    assert len(set(steps)) == 2


async def test_with_a_budget_the_step_starts_after_its_check(tmp_path: Path) -> None:
    config = RuntimeConfig(budget=BudgetConfig(max_usd_per_turn=100.0))
    path = await run_one_turn(tmp_path, ScriptedEngine(), config)
    lines = journal_lines(path)
    assert lines[0] == ["turn_started", "item_completed"]
    assert lines[1][0] == "model_step_started"
