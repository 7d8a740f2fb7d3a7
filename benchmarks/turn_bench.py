"""Turn streaming: deltas per second delivered through a session, against raw fsynced appends.

A scripted model streams N small text deltas as fast as it can (handing control to the event
loop after each, like a provider reading a network stream); a consumer reads the
session's events until the turn completes. Every event is persisted to the JSONL store at its
default durability (fsync) before it is delivered. The raw baseline, measured in the same run
on the same disk, is the cost of N appends of one delta-sized line each made durable with
``write`` + ``fdatasync``: what persisting every delta on its own would cost. The session
coalesces deltas and batches appends, so it should beat that baseline by a wide margin.

    python benchmarks/turn_bench.py            # the table
    python benchmarks/turn_bench.py --json     # machine-readable
    python benchmarks/turn_bench.py --quick    # a short run (CI smoke)
    python benchmarks/turn_bench.py --tools    # the tool-loop workload (see _tool_loop.py)
    python benchmarks/turn_bench.py --observers  # no observer / roder-otel off / exporting
    python benchmarks/turn_bench.py --observer otel  # one observer case only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson

from roder_api.events import AssistantContentDelta, TurnAborted, TurnComplete
from roder_api.inference import Completed, MessageDelta, TokenUsage, Usage
from roder_api.testing import Delay, ScriptedEngine, ScriptStep
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig, UserInput

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _observer_cases  # noqa: E402 - after the path setup
import _tool_loop  # noqa: E402 - after the path setup

TOKEN = "tok "
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def raw_fsync_appends(directory: Path, count: int) -> float:
    """Return the seconds ``count`` durable appends of one delta-sized line take."""
    line = (
        orjson.dumps({"seq": 1, "events": [{"type": "assistant_content_delta", "delta": TOKEN}]})
        + b"\n"
    )
    path = directory / "raw.jsonl"
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


async def session_turn(
    directory: Path, count: int, durability: str, observer: str = "none"
) -> dict[str, Any]:
    """Stream ``count`` deltas through a session; return the time and what was delivered.

    ``observer`` is a case of ``_observer_cases`` (``none``: no observer). ``close_seconds``
    is the time closing the runtime took after the turn (observers flush there);
    ``cpu_seconds`` and ``close_cpu_seconds`` the CPU time of the whole process (every
    thread: the store's, the observer's) over the turn and over the close.
    """
    # Delay(0) hands control back to the event loop after every delta, as a provider reading
    # a network stream does, so the recorder's writer runs while the model streams.
    script: list[ScriptStep] = []
    for _ in range(count):
        script += [MessageDelta(TOKEN), Delay(0)]
    script += [Usage(TokenUsage(1, count, count + 1)), Completed()]
    engine = ScriptedEngine(turns=[script])
    builder, exported = _observer_cases.builder_for(observer)
    builder.inference_engine(engine)
    builder.thread_store_factory(JsonlThreadStoreFactory(directory, durability=durability))
    runtime = Runtime(builder.build(), RuntimeConfig())
    async with runtime:
        thread_id = (await runtime.create_thread()).thread_id
        async with await runtime.start_session(thread_id) as session:
            delivered = 0
            text_length = 0
            start, cpu_start = time.perf_counter(), time.process_time()
            await session.submit(UserInput("go"))
            while True:
                event = (await session.next_event()).event
                if isinstance(event, AssistantContentDelta):
                    delivered += 1
                    text_length += len(event.delta)
                elif isinstance(event, (TurnComplete, TurnAborted)):
                    break
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
            appends = session.recorder.batches
        closing, cpu_closing = time.perf_counter(), time.process_time()
    close_seconds = time.perf_counter() - closing
    close_cpu = time.process_time() - cpu_closing
    if text_length != count * len(TOKEN):
        raise SystemExit(f"lost text: {text_length} of {count * len(TOKEN)} characters")
    spans = exported()
    if observer == "otel" and (spans is None or len(spans) != 2):
        raise SystemExit(f"the otel observer exported {spans!r}, not the turn's two spans")
    return {
        "seconds": elapsed,
        "delivered": delivered,
        "appends": appends,
        "close_seconds": close_seconds,
        "cpu_seconds": cpu,
        "close_cpu_seconds": close_cpu,
    }


def run(count: int, repeats: int) -> dict[str, Any]:
    """Return the measurements: medians over ``repeats`` runs of each case."""
    cases: dict[str, list[dict[str, Any]]] = {
        "raw write+fdatasync per delta": [],
        "session, jsonl fsync (default)": [],
        "session, jsonl durability=none": [],
    }
    with tempfile.TemporaryDirectory(prefix="roder-turn-bench-") as tmp:
        base = Path(tmp)
        for repeat in range(repeats):
            raw_dir = base / f"raw{repeat}"
            raw_dir.mkdir()
            seconds = raw_fsync_appends(raw_dir, count)
            cases["raw write+fdatasync per delta"].append(
                {"seconds": seconds, "delivered": count, "appends": count}
            )
            cases["session, jsonl fsync (default)"].append(
                anyio.run(session_turn, base / f"fsync{repeat}", count, "fsync")
            )
            cases["session, jsonl durability=none"].append(
                anyio.run(session_turn, base / f"none{repeat}", count, "none")
            )
    raw_median = statistics.median(r["seconds"] for r in cases["raw write+fdatasync per delta"])
    rows = []
    for name, runs in cases.items():
        median = statistics.median(r["seconds"] for r in runs)
        rows.append(
            {
                "case": name,
                "deltas": count,
                "median_seconds": median,
                "deltas_per_second": count / median,
                "delivered_events": int(statistics.median(r["delivered"] for r in runs)),
                "appends": int(statistics.median(r["appends"] for r in runs)),
                "speedup_vs_raw": raw_median / median,
                "runs_seconds": [r["seconds"] for r in runs],
            }
        )
    return {"deltas": count, "repeats": repeats, "delta_text": TOKEN, "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    """Print the measurements as a table."""
    print(
        f"turn streaming: {result['deltas']} deltas of {result['delta_text']!r}, "
        f"median of {result['repeats']} runs"
    )
    header = (
        f"{'case':<33} {'median s':>9} {'deltas/s':>11} {'delivered':>9} "
        f"{'appends':>8} {'vs raw':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in result["rows"]:
        print(
            f"{row['case']:<33} {row['median_seconds']:>9.3f} "
            f"{row['deltas_per_second']:>11,.0f} {row['delivered_events']:>9} "
            f"{row['appends']:>8} {row['speedup_vs_raw']:>7.1f}x"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=2048, help="deltas per turn")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    parser.add_argument("--tools", action="store_true", help="the tool-loop workload")
    parser.add_argument("--steps", type=int, default=20, help="tool steps (--tools)")
    parser.add_argument(
        "--observers", action="store_true", help="compare the observer cases (alternating)"
    )
    parser.add_argument(
        "--observer",
        choices=_observer_cases.CASES,
        help="only this observer case (none, installed: roder-otel off, otel: exporting)",
    )
    parser.add_argument(
        "--durability", default="fsync", help="JSONL durability for --observers (fsync)"
    )
    args = parser.parse_args(argv)
    if args.tools:
        return tool_loop_main(args)
    if args.observers or args.observer:
        return observers_main(args)
    if args.quick:
        args.deltas, args.repeats = min(args.deltas, 300), 1
    result = run(args.deltas, args.repeats)
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_table(result)
    return 0


def tool_loop_main(args: argparse.Namespace) -> int:
    """Run the tool-loop workload (``--tools``) and print its table or JSON."""
    repeats = 1 if args.quick else max(args.repeats, 5)
    runs = []
    with tempfile.TemporaryDirectory(prefix="roder-tool-bench-") as tmp:
        base = Path(tmp)
        for repeat in range(repeats):
            run_dir = base / f"tools{repeat}"
            measured = anyio.run(_tool_loop.tool_loop_turn, run_dir, args.steps)
            line = max(1, measured["journal_bytes"] // max(1, measured["appends"]))
            measured["raw_seconds"] = _tool_loop.raw_appends(base, measured["appends"], line)
            runs.append(measured)
    result = _tool_loop.summarize(runs, args.steps)
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(
        f"tool loop: one turn of {args.steps} sequential no-op tool steps, jsonl fsync, "
        f"median of {repeats} runs"
    )
    print(f"  per tool step:             {result['median_ms_per_step']:.2f} ms")
    print(
        f"  raw durable appends/step:  {result['raw_append_ms_per_step']:.2f} ms "
        f"({result['appends_per_step']:.1f} appends)"
    )
    print(f"  runtime overhead/step:     {result['runtime_overhead_ms_per_step']:.2f} ms")
    return 0


def observers_main(args: argparse.Namespace) -> int:
    """Run the observer cases in alternating order (``--observers``); print medians."""
    cases = [args.observer] if args.observer else list(_observer_cases.CASES)
    if any(case != "none" for case in cases) and not _observer_cases.available():
        raise SystemExit("install roder-otel (and the OpenTelemetry SDK) for these cases")
    _observer_cases.unconfigured_environment()
    count = min(args.deltas, 300) if args.quick else args.deltas
    repeats = 1 if args.quick else args.repeats
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="roder-observer-bench-") as tmp:
        for repeat in range(repeats):
            # Each round runs every case, starting from a different one: slow minutes on a
            # shared machine fall on all the cases alike.
            order = cases[repeat % len(cases) :] + cases[: repeat % len(cases)]
            for case in order:
                directory = Path(tmp) / f"{case}{repeat}"
                measured = anyio.run(session_turn, directory, count, args.durability, case)
                runs[case].append(measured)
    base = statistics.median(r["seconds"] for r in runs[cases[0]])
    rows = [
        {
            "case": _observer_cases.LABELS[case],
            "median_seconds": statistics.median(r["seconds"] for r in case_runs),
            "median_close_seconds": statistics.median(r["close_seconds"] for r in case_runs),
            "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in case_runs),
            "median_close_cpu_seconds": statistics.median(
                r["close_cpu_seconds"] for r in case_runs
            ),
            "vs_first": statistics.median(r["seconds"] for r in case_runs) / base,
            "runs_seconds": [r["seconds"] for r in case_runs],
        }
        for case, case_runs in runs.items()
    ]
    result = {"deltas": count, "repeats": repeats, "durability": args.durability, "rows": rows}
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(
        f"observers: one turn of {count} deltas, jsonl {args.durability}, median of {repeats} "
        "alternating runs"
    )
    header = (
        f"{'case':<38} {'turn s':>8} {'vs first':>9} {'CPU s':>7} {'close s':>8} "
        f"{'close CPU s':>11}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['case']:<38} {row['median_seconds']:>8.3f} {row['vs_first']:>8.2f}x "
            f"{row['median_cpu_seconds']:>7.3f} {row['median_close_seconds']:>8.3f} "
            f"{row['median_close_cpu_seconds']:>11.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
