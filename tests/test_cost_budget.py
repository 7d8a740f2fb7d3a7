"""Cost priced by genai-prices (compaction and billed failed attempts included) and budgets."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import anyio
import pytest

from roder_api.events import ErrorEvent, ModelStepStarted, TurnAborted, UsageUpdated
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
from roder_runtime import BudgetConfig, ReliabilityConfig, RuntimeConfig, load_config
from roder_runtime.turn._cost import group, price, priced_lines

from .conftest import make_runtime, roder_command
from .test_compaction import boundary

pytestmark = [pytest.mark.anyio, pytest.mark.core]

# gpt-4o: $2.50 per million input tokens, $10 per million output tokens (genai-prices).
BIG = TokenUsage(100_000, 10_000, 110_000)  # $0.25 + $0.10


def _usd(usage: TokenUsage) -> Decimal:
    found = price(usage, "gpt-4o", "scripted")
    assert found is not None
    return found


def _answer(text: str = "ok") -> list:  # type: ignore[type-arg]
    return [MessageDelta(text), Usage(BIG), Completed()]


def test_prices_come_from_genai_prices_and_unknown_models_are_not_guessed() -> None:
    assert _usd(BIG) == Decimal("0.35")
    cached = TokenUsage(1000, 100, 1100, cached_prompt_tokens=200)
    assert price(cached, "gpt-4o", "openai") == Decimal("0.00325")
    assert price(BIG, "scripted-1", "scripted") is None
    assert price(BIG, None) is None


async def test_cost_includes_compaction_and_a_billed_failed_retry(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    failed = TokenUsage(40_000, 0, 40_000)
    engine = ScriptedEngine(
        models=("gpt-4o",),
        turns=[
            [Usage(failed), Raise(ProviderFailure(ProviderFailureKind.OVERLOADED, "busy"))],
            _answer("first"),
        ],
        compactions=[[boundary("cmp_1"), Usage(TokenUsage(20_000, 1_000, 21_000)), Completed()]],
    )
    config = RuntimeConfig(
        default_model="gpt-4o",
        reliability=ReliabilityConfig(provider_retry_initial_backoff_ms=0),
    )
    base = tmp_path / "threads"
    async with make_runtime(base, engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "hello", turn_id="turn_a") == "first"
        history = await runtime.replay_history(thread_id)
        await runtime.compact_with_provider(thread_id, "turn_c", None, None, history)
        events = await (await runtime.journal(thread_id)).read_events()
    usage = [e.event for e in events if isinstance(e.event, UsageUpdated)]
    assert [(u.purpose, u.model) for u in usage] == [
        ("turn", "gpt-4o"),
        ("turn", "gpt-4o"),
        ("compaction", "gpt-4o"),
    ]
    rows = {row.key: row for row in group(priced_lines(events), "purpose")}
    assert rows["turn"].usd == _usd(failed) + _usd(BIG)  # the failed attempt is billed
    assert rows["compaction"].usd == _usd(TokenUsage(20_000, 1_000, 21_000))

    env = {**cli_env, "RODER_THREADS_PATH": str(base)}

    def cost(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*roder_command(), "threads", "cost", thread_id, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    table = await anyio.to_thread.run_sync(cost)
    assert table.returncode == 0, table.stderr
    print(table.stdout)
    assert "compaction" in table.stdout and "$0.510000" in table.stdout
    by_turn = json.loads((await anyio.to_thread.run_sync(cost, "--by", "turn", "--json")).stdout)
    assert [r["key"] for r in by_turn["rows"]] == ["turn_a", "turn_c"]
    assert Decimal(by_turn["total_usd"]) == Decimal("0.51")
    assert by_turn["unpriced_models"] == []


async def test_unpriced_usage_is_said_never_guessed(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    base = tmp_path / "threads"
    async with make_runtime(base) as runtime:  # the scripted engine's model has no price
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.run_turn(thread_id, "hello")
    done = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [*roder_command(), "threads", "cost", thread_id, "--by", "model"],
            env={**cli_env, "RODER_THREADS_PATH": str(base)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    assert done.returncode == 0, done.stderr
    assert "no known price for: scripted/scripted-default" in done.stdout
    assert "$0.000000 + unpriced" in done.stdout


async def test_cost_without_an_id_prices_every_thread(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    small = TokenUsage(10_000, 1_000, 11_000)  # $0.025 + $0.01
    engine = ScriptedEngine(
        models=("gpt-4o",),
        turns=[_answer("one"), [MessageDelta("two"), Usage(small), Completed()]],
    )
    base = tmp_path / "threads"
    async with make_runtime(base, engine, config=RuntimeConfig(default_model="gpt-4o")) as rt:
        first = (await rt.create_thread()).thread_id
        await rt.run_turn(first, "hello", turn_id="turn_1")
        second = (await rt.create_thread()).thread_id
        await rt.run_turn(second, "hello", turn_id="turn_2")
        empty = (await rt.create_thread()).thread_id  # no usage at all: costs nothing
    env = {**cli_env, "RODER_THREADS_PATH": str(base)}

    def cost(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*roder_command(), "threads", "cost", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = await anyio.to_thread.run_sync(cost, "--by", "turn", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(report["threads"]) == sorted([first, second, empty])
    assert {r["key"]: Decimal(r["usd"]) for r in report["rows"]} == {
        "turn_1": _usd(BIG),
        "turn_2": _usd(small),
    }
    assert Decimal(report["total_usd"]) == _usd(BIG) + _usd(small) == Decimal("0.385")
    table = await anyio.to_thread.run_sync(cost)
    assert table.returncode == 0, table.stderr
    assert "$0.385000" in table.stdout
    assert table.stdout.splitlines()[2].split()[:4] == ["turn", "110000", "0", "11000"]


@tool
def lookup(q: str) -> str:
    """Look a word up.

    Args:
        q: the word
    """
    return f"found {q}"


async def test_a_turn_stops_before_the_model_call_that_would_cross_its_budget(
    tmp_path: Path,
) -> None:
    from roder_api.extension import ExtensionRegistryBuilder
    from roder_jsonl_thread_store import JsonlThreadStoreFactory
    from roder_runtime import Runtime

    engine = ScriptedEngine(
        models=("gpt-4o",),
        turns=[[tool_call("lookup", {"q": "x"}), Usage(BIG), Completed()], _answer("never")],
    )
    builder = ExtensionRegistryBuilder().inference_engine(engine).tool(lookup)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=tmp_path / "threads"))
    config = RuntimeConfig(default_model="gpt-4o", budget=BudgetConfig(max_usd_per_turn=0.3))
    async with Runtime(builder.build(), config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "look it up") is None
        events = [e.event for e in await (await runtime.journal(thread_id)).read_events()]
    assert len(engine.requests) == 1  # the second model call was never made
    assert sum(isinstance(e, ModelStepStarted) for e in events) == 1
    error, aborted = events[-2:]
    assert isinstance(aborted, TurnAborted) and aborted.reason == "budget_exceeded"
    assert isinstance(error, ErrorEvent)
    assert "max_usd_per_turn = $0.3" in error.message and "spent $0.35" in error.message
    assert "over it" in error.message


async def test_a_thread_budget_stops_the_turn_that_would_cross_it(tmp_path: Path) -> None:
    engine = ScriptedEngine(models=("gpt-4o",), turns=[_answer("a"), _answer("b"), _answer("c")])
    config = RuntimeConfig(default_model="gpt-4o", budget=BudgetConfig(max_usd_per_thread=0.8))
    async with make_runtime(tmp_path / "threads", engine, config=config) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        assert await runtime.run_turn(thread_id, "one") == "a"
        assert await runtime.run_turn(thread_id, "two") == "b"
        # $0.70 spent: the check prices the prompt about to be sent (a few tokens), which
        # stays under $0.80, so the third turn runs and takes the thread to $1.05.
        assert await runtime.run_turn(thread_id, "three") == "c"
        assert await runtime.run_turn(thread_id, "four") is None
        events = [e.event for e in await (await runtime.journal(thread_id)).read_events()]
    assert len(engine.requests) == 3
    error = events[-2]
    assert isinstance(error, ErrorEvent) and "max_usd_per_thread = $0.8" in error.message
    assert "spent $1.05" in error.message
    assert events[-1] == TurnAborted(events[-1].turn_id, "budget_exceeded")  # type: ignore[union-attr]


def test_budget_and_otel_tables_load(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[budget]\nmax_usd_per_turn = 0.25\nmax_usd_per_thread = 5\n\n"
        '[otel]\nendpoint = "http://127.0.0.1:4318"\n'
    )
    config = load_config(path)
    assert config.budget == BudgetConfig(max_usd_per_turn=0.25, max_usd_per_thread=5.0)
    assert config.plugin_settings()["otel"] == {"endpoint": "http://127.0.0.1:4318"}
    path.write_text("[budget]\nmax_usd_per_turn = -1\n")
    with pytest.raises(Exception, match="above 0"):
        load_config(path)
    path.write_text("[budget]\nmax_usd = 1\n")
    with pytest.raises(Exception, match="unknown key"):
        load_config(path)
