"""The torture suite: crashes, disk faults, hostile input and load, with counts.

Children committing to each store are killed with SIGKILL at random moments and the store
is checked against what they acknowledged; writes and syncs fail with ENOSPC and EIO or
write short; journal files are damaged at random, and reordered or cut with every line
intact; 100 streams share one runtime. Prints a
table (trial kind, trials, faults injected, acknowledged commits, commits lost, corrupt
replays, recovery time) and exits non-zero when anything was lost or corrupt.

    python benchmarks/torture.py --quick          # bounded, for CI (scripts/smoke)
    python benchmarks/torture.py --json out.json  # the full run (>= 1,000 kill trials)
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _torture import crash, faults, hostile, leases, load, reorder, serve, tools  # noqa: E402 - path
from _torture.stats import KindStats, table  # noqa: E402
from _torture.stores import (  # noqa: E402
    StoreSpec,
    drop_schema,
    installed_backends,
    jsonl_specs,
    postgres_dsn,
)

FULL = {
    "append": 150,
    "turn": 60,
    "compact": 40,
    "inturn": 40,
    "tools": 300,
    "lease_lost": 30,
    "forked": 20,
    "serve": 200,
    "faults": 12,
    "hostile": 1000,
    "reorder": 300,
    "load_s": 10.0,
    "delay_s": 0.12,
}
QUICK = {
    "append": 4,
    "turn": 3,
    "compact": 3,
    "inturn": 3,
    "tools": 6,
    "lease_lost": 2,
    "forked": 1,
    "serve": 3,
    "faults": 1,
    "hostile": 60,
    "reorder": 12,
    "load_s": 2.0,
    "delay_s": 0.08,
}


def _log_counter() -> dict[str, int]:
    """Count the stores' recovery warnings instead of printing them mid-table."""
    counts: dict[str, int] = {}

    class Counter(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            counts[record.name] = counts.get(record.name, 0) + 1

    logger = logging.getLogger("roder")
    logger.addHandler(Counter(logging.WARNING))
    logger.propagate = False
    return counts


def store_specs(base: Path) -> list[StoreSpec]:
    """Return every store to torture that is installed and reachable here."""
    specs = jsonl_specs(str(base / "jsonl"))
    backends = installed_backends()
    if "sqlite" in backends:
        specs.append(StoreSpec("sqlite", "sqlite", {"path": str(base / "sqlite" / "roder.db")}))
    dsn = postgres_dsn() if "postgres" in backends else None
    if dsn:
        schema = f"torture_{os.getpid()}_{int(time.time())}"
        specs.append(StoreSpec("postgres", "postgres", {"dsn": dsn, "schema": schema}))
    return specs


def crash_modes() -> list[str]:
    """Return the crash-trial modes this runtime supports (sessions, compaction as landed)."""
    from roder_runtime import Runtime

    modes = ["append"]
    modes.append("session" if hasattr(Runtime, "start_session") else "turn")
    if hasattr(Runtime, "compact_with_provider"):
        modes.append("compact")
    if importlib.util.find_spec("roder_runtime.turn._inturn") is not None:
        modes.append("inturn")  # in-turn native compaction, staged with its model step
    return modes


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run every section; return the JSON report."""
    plan = QUICK if args.quick else FULL
    sections = (
        set(args.only.split(","))
        if args.only
        else {"crash", "leases", "faults", "hostile", "reorder", "load", "serve"}
    )
    kinds: list[KindStats] = []
    specs = store_specs(workdir / "stores")
    ctx = crash.mp_context(args.start_method)
    started = time.perf_counter()

    def progress(stats: KindStats) -> None:
        kinds.append(stats)
        if not args.quiet:
            status = "ok" if stats.ok else f"LOST {stats.lost} CORRUPT {stats.corrupt}"
            if stats.skipped:
                status = "skipped: " + stats.skipped
            print(
                f"  {stats.kind}: {stats.trials} trials, {status} "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    if "crash" in sections:
        for mode in crash_modes():
            trials = plan["turn"] if mode in ("turn", "session") else plan[mode]
            delay = plan["delay_s"] * (3 if mode != "append" else 1)
            for number, spec in enumerate(specs):
                progress(
                    await crash.run_crash_trials(
                        mode,
                        spec,
                        int(trials),
                        workdir / "crash",
                        seed=args.seed * 100 + number,
                        max_delay=delay,
                        ctx=ctx,
                    )
                )
    if "crash" in sections or "tools" in sections:
        # Agent loops killed in their tool steps (one store: the default, fsync JSONL).
        progress(
            await tools.run_tool_crash_trials(
                int(plan["tools"]), workdir / "tools", seed=args.seed, max_delay=1.0
            )
        )
    if "leases" in sections:
        # A holder whose PostgreSQL lease connection is ended under it; a holder SIGKILLed
        # while the background job it forked (holding every descriptor) runs on.
        postgres = [spec for spec in specs if spec.backend == "postgres"]
        for spec in postgres:
            progress(
                await leases.run_lease_lost_trials(
                    spec, int(plan["lease_lost"]), workdir / "lease-lost", seed=args.seed
                )
            )
        if not postgres:
            progress(leases.skipped("lease lost / postgres", "PostgreSQL is not reachable"))
        for number, spec in enumerate(leases.lease_specs(specs)):
            progress(
                await leases.run_forked_child_trials(
                    spec,
                    int(plan["forked"]),
                    workdir / f"forked-{spec.name}",
                    seed=args.seed * 100 + number,
                )
            )
    if "serve" in sections and importlib.util.find_spec("roder_server") is not None:
        # roder serve SIGKILLed during runs and streams, restarted on the same port: on
        # each store (PostgreSQL when it answers).
        for backend, dsn in serve.serve_backends():
            progress(
                await anyio.to_thread.run_sync(
                    lambda backend=backend, dsn=dsn: serve.run_serve_trials(
                        int(plan["serve"]),
                        workdir / "serve",
                        seed=args.seed,
                        backend=backend,
                        dsn=dsn,
                    )
                )
            )
    if "faults" in sections:
        for number, spec in enumerate(specs):
            if spec.backend != "jsonl":
                # SQLite writes from C and PostgreSQL from its server: os.write wrappers
                # cannot reach them. SQLite gets a real full disk below.
                continue
            for stats in await faults.run_injected_faults(
                spec, int(plan["faults"]), seed=args.seed * 100 + number
            ):
                progress(stats)
        for mode in ("fsync", "group", "none"):
            progress(
                await faults.run_enospc(
                    lambda path, mode=mode: StoreSpec(
                        f"jsonl-{mode}", "jsonl", {"path": str(path), "durability": mode}
                    ),
                    workdir / f"tmpfs-{mode}",
                    max(1, int(plan["faults"]) // 2),
                    seed=args.seed,
                )
            )
        if "sqlite" in installed_backends():
            progress(
                await faults.run_enospc(
                    lambda path: StoreSpec("sqlite", "sqlite", {"path": str(path / "roder.db")}),
                    workdir / "tmpfs-sqlite",
                    max(1, int(plan["faults"]) // 2),
                    seed=args.seed,
                )
            )
    if "hostile" in sections:
        progress(
            await hostile.run_hostile(
                lambda path: StoreSpec("jsonl", "jsonl", {"path": str(path)}),
                workdir / "hostile",
                int(plan["hostile"]),
                seed=args.seed,
                fsck=hostile.store_fsck if args.fsck and hostile.fsck_available() else None,
            )
        )
    if "reorder" in sections:
        # Lines swapped or overwritten at equal length, or a clean cut: every line intact.
        progress(
            await reorder.run_reordered(
                lambda path: StoreSpec("jsonl", "jsonl", {"path": str(path)}),
                workdir / "reorder",
                int(plan["reorder"]),
                seed=args.seed,
            )
        )
    for spec in specs:
        if spec.backend == "postgres":
            drop_schema(spec.settings["dsn"], spec.settings["schema"])
    load_results = []
    if "load" in sections:
        # The default durability, then group commit (what many concurrent streams want).
        for durability in ("fsync", "group") if not args.quick else ("fsync",):
            load_results.append(
                await load.run_load(
                    workdir / f"load-{durability}",
                    sessions=args.sessions,
                    seconds=float(plan["load_s"]),
                    durability=durability,
                )
            )
    elapsed = time.perf_counter() - started
    ok = all(k.ok for k in kinds) and all(r.lost == 0 and r.reordered == 0 for r in load_results)
    return {
        "mode": "quick" if args.quick else "full",
        "seed": args.seed,
        "elapsed_s": round(elapsed, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "kill_trials": sum(
            k.trials
            for k in kinds
            if k.kind.split(" / ")[0] in (*crash.MODES, "tools", "forked child", "serve")
        ),
        "kinds": [k.to_json() for k in kinds],
        "load": [r.to_json() for r in load_results],
        "load_summary": [r.summary() for r in load_results],
        "table": table(kinds),
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the suite, print the table, write ``--json``; return 1 if anything was lost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a bounded run for CI")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--only", help="comma list of sections: crash,leases,faults,hostile,reorder,load,serve"
    )
    parser.add_argument("--sessions", type=int, default=100, help="concurrent load streams")
    parser.add_argument(
        "--start-method",
        default="forkserver",
        choices=("forkserver", "spawn"),
        help="how crash-trial children start (default forkserver: preloaded, fast)",
    )
    parser.add_argument("--no-fsck", dest="fsck", action="store_false", help="skip roder fsck")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    warnings = _log_counter()
    with tempfile.TemporaryDirectory(prefix="roder-torture-") as tmp:
        report = anyio.run(run, args, Path(tmp))
    report["store_warnings"] = warnings
    print(report["table"])
    for kind in report["kinds"]:
        if kind["notes"]:
            print(f"  {kind['kind']}: " + ", ".join(f"{k} {v}" for k, v in kind["notes"].items()))
    for summary in report["load_summary"]:
        print(summary)
    print(
        f"{report['kill_trials']} kill trials; {report['elapsed_s']} s; "
        + ("nothing lost, nothing corrupt" if report["ok"] else "LOST OR CORRUPT DATA: see above")
    )
    if not report["ok"]:
        for kind in report["kinds"]:
            for problem in kind["problems"]:
                print("  " + problem)
        for result in report["load"]:
            for problem in result["problems"]:
                print("  " + problem)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
