"""Command start-up: wall time of the installed ``roder`` and the plugin modules it imports.

Runs ``roder --help``, ``roder threads list`` (a JSONL store holding a few threads) and
``roder prompt hi`` (the scripted engine) with ``RODER_HOME`` in a temporary directory,
each ``--runs`` times (median reported), then once more with ``PYTHONPROFILEIMPORTTIME=1``
to list the plugin packages imported and the slowest imports. The floor is measured the same
way: the interpreter starting and stopping (``python -c pass``, with and without ``site``).

Bytecode is written (``PYTHONDONTWRITEBYTECODE`` is dropped for the runs) and the warm-up
runs compile every module first, as installing a wheel does: with the editable install and
no ``.pyc`` files, each run would compile the project's sources again (about 60 ms).

    .venv/bin/python benchmarks/startup_bench.py            # 5 runs each
    .venv/bin/python benchmarks/startup_bench.py --quick    # 2 runs each
    .venv/bin/python benchmarks/startup_bench.py --json out.json --top 15
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "python -S -c pass (no site)": ["-S", "-c", "pass"],
}
"""The interpreter alone: with ``site`` (the environment's ``.pth`` files) and without."""

COMMANDS: dict[str, list[str]] = {
    "roder --help": ["--help"],
    "roder threads list": ["threads", "list"],
    "roder prompt hi": ["prompt", "hi"],
}


def roder_executable() -> str:
    """Return the ``roder`` console script next to this interpreter."""
    found = Path(sys.executable).with_name("roder")
    if not found.exists():
        raise SystemExit(f"no roder next to {sys.executable}; install the project first")
    return str(found)


def plugin_packages() -> dict[str, str]:
    """Return plugin name -> its package (the entry point's module less ``.plugin``)."""
    return {
        ep.name: ep.value.split(":")[0].removesuffix(".plugin")
        for ep in importlib.metadata.entry_points(group="roder")
    }


def run(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Return the wall time of one ``roder`` run and its outcome (a failure stops the run)."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed, done


def imports(stderr: str) -> list[tuple[str, int, int]]:
    """Return (module, self µs, cumulative µs) from ``-X importtime`` lines."""
    found = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:") :].split("|")]
        if not parts[0].isdigit():
            continue  # the header line
        found.append((parts[2].strip(), int(parts[0]), int(parts[1])))
    return found


def plugins_imported(modules: list[str], packages: dict[str, str]) -> list[str]:
    """Return the plugins (by entry-point name) whose module was imported."""
    return sorted(
        name
        for name, package in packages.items()
        if any(m == package or m.startswith(package + ".") for m in modules)
    )


def main() -> None:
    """Measure and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 runs each")
    parser.add_argument("--top", type=int, default=10, help="slowest imports shown per command")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs
    roder = roder_executable()
    packages = plugin_packages()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as home:
        skipped = ("RODER_", "OTEL_", "PYTHONDONTWRITEBYTECODE")
        env = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
        env["RODER_HOME"] = home
        for _ in range(3):  # a store with a few threads; every module byte-compiled
            run([roder, "prompt", "hi"], env)
        run([roder, "threads", "list"], env)
        floor = {
            label: statistics.median(run([sys.executable, *argv], env)[0] for _ in range(runs))
            for label, argv in FLOOR.items()
        }
        for label, argv in COMMANDS.items():
            times = [run([roder, *argv], env)[0] for _ in range(runs)]
            _, done = run([roder, *argv], {**env, "PYTHONPROFILEIMPORTTIME": "1"})
            found = imports(done.stderr)
            slowest = sorted(found, key=lambda m: m[2], reverse=True)
            top_level = [m for m in slowest if "." not in m[0]][: args.top]
            results[label] = {
                "median_s": statistics.median(times),
                "times_s": times,
                "plugins": plugins_imported([m[0] for m in found], packages),
                "modules": len(found),
                "slowest_top_level": [(m[0], m[2] / 1e6) for m in top_level],
            }
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"load average {load}; floor: " + ", ".join(f"`{k}` {v:.3f} s" for k, v in floor.items()))
    print(f"\n| command | median of {runs} (s) | plugins imported | modules |")
    print("|---|---|---|---|")
    for label, r in results.items():
        plugins = ", ".join(r["plugins"]) or "none"  # type: ignore[arg-type]
        print(f"| `{label}` | {r['median_s']:.3f} | {plugins} | {r['modules']} |")
    for label, r in results.items():
        print(f"\nslowest top-level imports of `{label}` (cumulative s):")
        for name, seconds in r["slowest_top_level"]:  # type: ignore[attr-defined]
            print(f"  {seconds:7.3f}  {name}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"floor_s": floor, **results}, indent=2))


if __name__ == "__main__":
    main()
