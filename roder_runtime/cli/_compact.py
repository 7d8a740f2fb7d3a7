"""``roder compact``: compact a thread now, and say what was committed or why it was discarded."""

from __future__ import annotations

import argparse
from typing import Any

from roder_api.codec import to_dict
from roder_api.errors import CompactionError
from roder_api.inference import TokenUsage
from roder_api.transcript import ContextCompaction, native_compaction_items
from roder_runtime._runtime import Runtime
from roder_runtime.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    add_command,
    add_json_flag,
    count,
    open_runtime,
    print_json,
)
from roder_runtime.cli._ids import resolve_thread_id
from roder_runtime.compaction._compaction import CompactionResult, usage_report
from roder_runtime.model._ids import new_id


def register(subparsers: Any) -> None:
    """Add the ``compact`` command."""
    parser = add_command(
        subparsers,
        "compact",
        help="compact a thread's history now",
        description=(
            "Compact a thread: the engine turns its replay history into one compaction "
            "boundary (natively, or as a summary when the engine has no native compaction). "
            "The boundary is committed only after a clean stream; otherwise the history is "
            "left exactly as it was (exit status 1). Every token used is billed either way."
        ),
        examples=(
            "roder compact 3f2a...",
            "roder compact 3f2a... --json",
            "roder compact 3f2a... --engine openai --model gpt-5-mini",
        ),
    )
    parser.add_argument("thread_id", metavar="THREAD_ID", help="the thread to compact")
    parser.add_argument("--engine", metavar="ID", help="engine id (default: default_engine)")
    parser.add_argument("--model", metavar="MODEL", help="model id (default: default_model)")
    add_json_flag(parser)
    parser.set_defaults(handler=compact_command)


async def compact_command(args: argparse.Namespace) -> int:
    """Compact a thread; exit 0 when a boundary was committed, 1 when it was discarded."""
    async with open_runtime(args) as runtime:
        return await run_compact(runtime, args)


def _boundary_label(boundary: Any) -> str:
    if isinstance(boundary, ContextCompaction):
        first = boundary.summary.strip().splitlines()[0] if boundary.summary.strip() else ""
        return f"summary boundary: {first[:60]}"
    ids = [str(e.get("id")) for e in native_compaction_items(boundary) if e.get("id")]
    return "native boundary" + (f" {', '.join(ids)}" if ids else "")


async def run_compact(runtime: Runtime, args: argparse.Namespace) -> int:
    """Run ``roder compact`` on an open runtime; return the exit code."""
    thread_id = args.thread_id = await resolve_thread_id(runtime, args.thread_id)
    engine = runtime.engine(args.engine)
    model = args.model or runtime.default_model(engine)
    history = await runtime.replay_history(thread_id)
    if not history:
        raise CommandError(f"thread {thread_id} has no history to compact")
    turn_id = new_id("compaction")
    result: CompactionResult | None = None
    error: CompactionError | None = None
    try:
        result = await runtime.compact_with_provider(thread_id, turn_id, engine.id, model, history)
    except CompactionError as exc:
        error = exc
    replay = await runtime.replay_history(thread_id)
    by_purpose = await runtime.usage_by_purpose(thread_id)
    if args.json:
        report: dict[str, Any] = {
            "thread_id": thread_id,
            "engine": engine.id,
            "model": model,
            "status": "committed" if result is not None else "discarded",
            "reason": None if error is None else error.reason,
            "message": None if error is None else str(error),
            "mode": None if result is None else result.mode,
            "attempts": result.attempts if result is not None else (error.attempts if error else 0),
            "usage": to_dict(result.usage if result is not None else _error_usage(error)),
            "boundary": None if result is None else to_dict(result.boundary),
            "replay_items_before": len(history),
            "replay_items_after": len(replay),
            "usage_by_purpose": usage_report(by_purpose),
        }
        print_json(report)
        return EXIT_OK if result is not None else EXIT_FAILURE
    spent = ", ".join(f"{p} {u.total_tokens}" for p, u in by_purpose.items()) or "none"
    if result is not None:
        print(
            f"committed {result.mode} compaction of thread {thread_id} "
            f"({_boundary_label(result.boundary)})"
        )
        print(
            f"replay history: {count(len(history), 'item')} -> {len(replay)} "
            f"(the boundary{'' if len(replay) == 1 else ' and what follows it'})"
        )
        print(
            f"cost: {result.usage.total_tokens} tokens in {result.attempts} attempt(s); "
            f"thread usage by purpose: {spent}"
        )
        return EXIT_OK
    assert error is not None
    print(f"discarded compaction of thread {thread_id}: {error.reason}")
    print(f"  {error}")
    print(
        f"replay history unchanged: {count(len(replay), 'item')}; thread usage by purpose: {spent}"
    )
    return EXIT_FAILURE


def _error_usage(error: CompactionError | None) -> TokenUsage:
    if error is None or error.usage is None:
        return TokenUsage()
    return error.usage
