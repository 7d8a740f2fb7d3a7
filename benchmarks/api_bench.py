"""Benchmark the public ``Runtime`` API where users feel it, next to raw baselines and a peer.

Five workloads (issue 13), each measured in the same run three ways: through Roder's public
``Runtime`` API on the JSONL store with its default durability, as the raw file operation
that bounds it, and with the OpenAI Agents SDK's ``SQLiteSession`` (the store most users
would pick instead; PyPI ``openai-agents``, a benchmark-only dependency: ``pip install
-e '.[bench]'``; its column is skipped with a note when it is not installed). Items are
user messages of about 400 bytes.

- W1: ``persist_turn_item`` one at a time. Raw: ``write`` + ``fdatasync`` per item. Peer:
  ``add_items([item])`` per item. An (info) row: the raw loop with each append handed to a
  writer thread and awaited (the least any store pays that keeps blocking I/O off the loop).
- W2: 50 concurrent ``persist_turn_item`` calls to one thread, every one durable before it
  returns. Raw: 50 writes and one ``fdatasync``. Peer: ``add_items`` of 50 items (its batch
  API). The target compares with W1's raw rate (a sync per append). An (info) row: Roder's
  own batch call, ``persist_turn_items`` of 50 items (the peer's call), against the raw
  batch (50 writes, one ``fdatasync``). Another (info) row: the like-for-like peer, 50
  concurrent ``add_items([item])`` calls on one session, its ratio Roder / peer.
- W3: ``load_thread`` of a 50,000-item thread on a runtime opened just before (outside the
  timing). Raw: read the file and ``orjson.loads`` each line. Peer: ``get_items()`` on a
  fresh session. Peak memory (tracemalloc) of Roder and raw, measured apart.
- W4: ``replay_history`` of a 50,000-item thread whose last compaction boundary is 20
  items from the end, on a runtime opened just before (its store's index opened by a
  listing, the thread not read since). Raw: read the last 20 lines. Peer:
  ``get_items(limit=20)``.
- W5: 1,000 × ``create_thread`` with 10 items each (``persist_turn_items``). Raw: create a
  file, write 10 lines, ``fdatasync``, close. Peer: a session per thread, ``add_items`` of
  10 items. An (info) row: the file operations of a durable create and first append (the
  first line synced in a temporary file, linked, the directory synced, the append synced)
  in a plain loop.

Rates are items (or threads) per second from the median of the repeats; ratios are
Roder / raw in the direction of the target. Prints a table; ``--json PATH`` writes the
numbers; ``--quick`` runs small sizes in well under 30 s (CI's smoke test).
Run: ``python benchmarks/api_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio  # SQLiteSession (the peer) runs on asyncio only
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from _api_common import (
    FULL,
    QUICK,
    Sizes,
    peer_available,
    set_durability,
    set_store,
    store_factory,
)
from _api_reads import long_thread, w3, w4
from _api_writes import w1, w2, w5

STORE_NAMES = {"jsonl": "JSONL", "sqlite": "SQLite"}
"""The stores ``--store`` measures Roder on, and how the table names them."""

# --- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    unit: str  # "/s" (higher is better) or "ms" (lower is better)
    raw: float
    roder: float
    peer: float | None
    ratio: float  # in the direction of the target
    target: str
    met: bool | None  # None: an (info) row without a target


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}/s"
    return f"{value * 1000:,.2f} ms"


def rows_from(results: dict[str, dict[str, float | None]], sizes: Sizes) -> list[Row]:
    rows: list[Row] = []

    def rate_row(name: str, key: str, target: float, baseline: float) -> None:
        r = results[key]
        assert r["raw"] is not None and r["roder"] is not None
        ratio = r["roder"] / baseline
        met = ratio >= target and (r["peer"] is None or r["roder"] > r["peer"])
        rows.append(Row(name, "/s", r["raw"], r["roder"], r["peer"], ratio, f">= {target} x", met))

    def time_row(name: str, key: str, target: float, *, faster: bool) -> None:
        r = results[key]
        assert r["raw"] is not None and r["roder"] is not None
        # faster: a speed ratio (raw time / Roder time, >= target); else a time ratio.
        ratio = r["raw"] / r["roder"] if faster else r["roder"] / r["raw"]
        ok = ratio >= target if faster else ratio <= target
        met = ok and (r["peer"] is None or r["roder"] < r["peer"])
        sign = ">=" if faster else "<="
        label = "speed" if faster else "time"
        target_text = f"{label} {sign} {target} x"
        rows.append(Row(name, "ms", r["raw"], r["roder"], r["peer"], ratio, target_text, met))

    if "w1" in results:
        raw1 = results["w1"]["raw"]
        assert raw1 is not None
        rate_row(f"W1 persist_turn_item x {sizes.w1_items:,}", "w1", 0.7, raw1)
        hop = results["w1"].get("raw_via_thread")
        if hop is not None:
            r1 = results["w1"]
            assert r1["roder"] is not None
            rows.append(
                Row(
                    "W1 (info) raw: write+fdatasync via a thread",
                    "/s",
                    hop,
                    r1["roder"],
                    r1["peer"],
                    r1["roder"] / hop,
                    "(info)",
                    None,
                )
            )
    if "w2" in results:
        # The target: 8 x a sync per append (W1's raw rate), each commit durable.
        base = results["w1"]["raw"] if "w1" in results else None
        raw2 = results["w2"]["raw"]
        assert raw2 is not None
        rate_row(
            "W2 50 concurrent persist_turn_item (vs W1 raw)",
            "w2",
            8.0,
            base if base is not None else raw2,
        )
        batch = results["w2"].get("roder_batch")
        if batch is not None:
            rows.append(
                Row(
                    f"W2 (info) persist_turn_items of {sizes.w2_tasks} (the peer's call)",
                    "/s",
                    raw2,
                    batch,
                    results["w2"]["peer"],
                    batch / raw2,
                    "(info)",
                    None,
                )
            )
        singles = results["w2"].get("peer_singles")
        if singles is not None:
            r2 = results["w2"]
            assert r2["roder"] is not None
            rows.append(
                Row(
                    f"W2 (info) peer, {sizes.w2_tasks} concurrent single calls",
                    "/s",
                    raw2,
                    r2["roder"],
                    singles,
                    r2["roder"] / singles,
                    "(info) vs peer",
                    None,
                )
            )
    if "w3" in results:
        time_row(f"W3 load_thread, {sizes.w3_items:,} items", "w3", 0.5, faster=True)
    if "w4" in results:
        time_row(f"W4 replay_history, 20 of {sizes.w3_items:,}", "w4", 3.0, faster=False)
    if "w5" in results:
        time_row(f"W5 create_thread x {sizes.w5_threads:,}, 10 items", "w5", 1.5, faster=False)
        same = results["w5"].get("raw_same_syncs")
        if same is not None:
            r5 = results["w5"]
            assert r5["roder"] is not None
            rows.append(
                Row(
                    "W5 (info) raw: the 3 syncs of create + append",
                    "ms",
                    same,
                    r5["roder"],
                    r5["peer"],
                    r5["roder"] / same,
                    "(info)",
                    None,
                )
            )
    return rows


def print_table(rows: list[Row], results: dict[str, dict[str, float | None]]) -> None:
    header = ("workload (public API)", "raw", "SQLiteSession", "Roder", "ratio", "target", "met")
    table = [header]
    for row in rows:
        table.append(
            (
                row.name,
                _fmt(row.raw, row.unit),
                _fmt(row.peer, row.unit),
                _fmt(row.roder, row.unit),
                f"{row.ratio:.2f}",
                row.target if row.met is None else row.target + " & ahead of peer",
                "-" if row.met is None else "yes" if row.met else "NO",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for index, line in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")
        if index == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if "w3" in results:
        w3r = results["w3"]
        print(
            f"W3 peak memory: Roder {w3r['roder_peak_mb']:.1f} MB, raw {w3r['raw_peak_mb']:.1f} MB"
        )
    if not peer_available():
        print("note: openai-agents is not installed; the SQLiteSession column is skipped")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(",")) if args.only else {"w1", "w2", "w3", "w4", "w5"}
    root = Path(tempfile.mkdtemp(prefix="roder-api-bench-", dir=args.dir))
    results: dict[str, dict[str, float | None]] = {}
    try:
        if "w1" in only or "w2" in only:
            results["w1"] = await w1(root, sizes)
        if "w2" in only:
            results["w2"] = await w2(root, sizes)
        if "w3" in only or "w4" in only:
            thread = await long_thread(root, sizes.w3_items, boundary_from_end=20)
            if "w3" in only:
                results["w3"] = await w3(thread, sizes)
            if "w4" in only:
                results["w4"] = await w4(thread, sizes)
        if "w5" in only:
            results["w5"] = await w5(root, sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = rows_from(results, sizes)
    durability = getattr(store_factory(root / "probe"), "durability", None)
    print(
        f"Roder: public Runtime API, {STORE_NAMES[args.store]} store, durability {durability!r}; "
        f"{'quick' if args.quick else 'full'} sizes {sizes}"
    )
    print_table(rows, results)
    return {
        "quick": args.quick,
        "durability": durability,
        "store": args.store,
        "sizes": sizes.__dict__,
        "peer_installed": peer_available(),
        "results": results,
        "rows": [row.__dict__ for row in rows],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    parser.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    parser.add_argument("--only", metavar="W1,W2,...", help="run only these workloads")
    parser.add_argument("--dir", help="where to put the temporary files (default: the tmp dir)")
    parser.add_argument(
        "--durability", help="the JSONL durability to measure (default: the store's default)"
    )
    parser.add_argument(
        "--store", choices=sorted(STORE_NAMES), default="jsonl", help="the store Roder runs on"
    )
    args = parser.parse_args(argv)
    set_durability(args.durability)
    set_store(args.store)
    if args.only:
        args.only = args.only.lower()
    data = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
