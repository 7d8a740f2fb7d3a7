"""``roder threads trace`` and ``roder threads cost``: a thread's trace and what it cost.

Both only read the journal. The trace is rebuilt by ``roder_api.tracing`` (the same pure
code ``roder-otel`` exports live with); the cost is priced by ``roder_runtime.turn._cost``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from roder_runtime.cli._common import (
    EXIT_OK,
    add_command,
    add_json_flag,
    open_runtime,
    print_json,
    write_text_file,
)
from roder_runtime.cli._ids import resolve_thread_id

if TYPE_CHECKING:  # imported when the command runs: `roder threads list` needs neither
    from decimal import Decimal

    from roder_api.events import JournalEvent
    from roder_runtime._runtime import Runtime
    from roder_runtime.turn._cost import CostRow, PricedUsage


def register(sub: Any) -> None:
    """Add ``threads trace`` and ``threads cost``."""
    trace_parser = add_command(
        sub,
        "trace",
        help="write a thread's turns as an OpenTelemetry trace (OTLP JSON)",
        description=(
            "Rebuild the trace of every turn of a thread from its journal, in the "
            "OpenTelemetry GenAI conventions, and write it as OTLP JSON (an "
            "ExportTraceServiceRequest a collector's OTLP/HTTP JSON endpoint takes). Times "
            "are the events' recorded times; a turn that crashed or was aborted ends with an "
            "error status. Prompt and output text only with "
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true."
        ),
        examples=(
            "roder threads trace ID -o trace.json",
            "roder threads trace ID --tree",
            "curl -H 'Content-Type: application/json' --data @trace.json "
            "http://collector:4318/v1/traces",
        ),
    )
    trace_parser.add_argument("thread_id", metavar="ID", help="the thread's id")
    trace_parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE")
    trace_parser.add_argument(
        "--tree", action="store_true", help="print the span tree as text instead"
    )
    trace_parser.set_defaults(handler=trace_command)

    cost_parser = add_command(
        sub,
        "cost",
        help="what a thread's tokens cost, by turn, purpose or model",
        description=(
            "Price every billed usage of a thread's journal with genai-prices: turns, "
            "compaction, discarded compaction and failed attempts that were retried. Usage "
            "of a model without a known price is listed as unpriced, never guessed. "
            "Without ID: every thread of the store."
        ),
        examples=(
            "roder threads cost ID",
            "roder threads cost ID --by turn",
            "roder threads cost --by model --json",
        ),
    )
    cost_parser.add_argument("thread_id", metavar="ID", nargs="?", help="the thread's id")
    cost_parser.add_argument(
        "--by", choices=("turn", "purpose", "model"), default="purpose", help="group (purpose)"
    )
    add_json_flag(cost_parser)
    cost_parser.set_defaults(handler=cost_command)


async def _journal(runtime: Runtime, thread_id: str) -> list[JournalEvent]:
    return await (await runtime.journal(thread_id)).read_events()


async def trace_command(args: argparse.Namespace) -> int:
    """Write a thread's rebuilt trace as OTLP JSON (or its span tree as text)."""
    import orjson

    from roder_api.tracing import capture_content, otlp_json, rebuild_traces, span_tree

    async with open_runtime(args) as runtime:
        thread_id = await resolve_thread_id(runtime, args.thread_id)
        events = await _journal(runtime, thread_id)
    traces = rebuild_traces(thread_id, events, capture_content=capture_content(os.environ))
    if args.tree:
        print("\n".join(span_tree(trace) for trace in traces))
        return EXIT_OK
    text = orjson.dumps(otlp_json(traces), option=orjson.OPT_INDENT_2).decode() + "\n"
    if not args.output or args.output == "-":
        sys.stdout.write(text)
    else:
        await write_text_file(args.output, text)
        spans = sum(len(trace.spans) for trace in traces)
        print(f"wrote {len(traces)} turns ({spans} spans) of thread {thread_id} to {args.output}")
    return EXIT_OK


async def cost_command(args: argparse.Namespace) -> int:
    """Print what a thread (or every thread) cost, grouped."""
    from decimal import Decimal

    from roder_runtime.threads import all_threads
    from roder_runtime.turn._cost import group, priced_lines, unpriced_models

    lines: list[PricedUsage] = []
    async with open_runtime(args) as runtime:
        if args.thread_id is not None:
            ids = [await resolve_thread_id(runtime, args.thread_id)]
        else:
            ids = [meta.thread_id for meta in await all_threads(runtime)]
        for thread_id in ids:
            lines += priced_lines(await _journal(runtime, thread_id))
    rows = group(lines, args.by)
    total = sum((row.usd for row in rows), Decimal(0))
    unpriced = unpriced_models(lines)
    if args.json:
        print_json(
            {
                "threads": ids,
                "by": args.by,
                "rows": [row.to_json() for row in rows],
                "total_usd": str(total),
                "unpriced_models": unpriced,
            }
        )
        return EXIT_OK
    print(_table(args.by, rows, total))
    if unpriced:
        print("no known price for: " + ", ".join(unpriced) + " (their usage is not in the total)")
    return EXIT_OK


def _table(by: str, rows: list[CostRow], total: Decimal) -> str:
    header = (by, "input", "cached", "output", "USD")
    body = [
        (
            row.key,
            str(row.usage.prompt_tokens),
            str(row.usage.cached_prompt_tokens),
            str(row.usage.completion_tokens),
            _usd(row.usd) + (" + unpriced" if row.unpriced else ""),
        )
        for row in rows
    ]
    body.append(("total", "", "", "", _usd(total)))
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    out = []
    for n, row in enumerate([header, *body]):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0 or n == len(body) - 1:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _usd(amount: Decimal) -> str:
    return f"${amount:.6f}"
