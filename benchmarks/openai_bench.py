"""The OpenAI-compatible surface: what ``roder serve`` adds to the SDK's time to first delta.

One workload, next to its baseline measured in the same run (wall time, medians and p90):

- O1 the official ``openai`` SDK streams a response and stops at the first
  ``response.output_text.delta``: through ``roder serve`` (``/v1/responses``, the
  ``openai-chat`` engine pointed at a local Chat Completions server), against the same SDK
  streaming ``/chat/completions`` from that server directly, stopping at the first content
  delta. The server is llm-katan's echo backend (no model weights). Through Roder the
  figure includes journaling the input and the first delta before it is streamed (persist
  before deliver), on the JSONL store; "new conversation" also creates a thread per
  response, "one conversation" continues one thread. Each Roder row has its own baseline,
  measured in turn with it (direct, Roder, direct, ...): "one message" for a new
  conversation; for one conversation the direct client sends the same whole conversation
  the engine gets through Roder (every earlier input and reply), so the difference is
  Roder's and not the prompt's. Every stream is read to its end after the figure is
  taken (untimed): the next request never queues behind the last one's turn.

    python benchmarks/openai_bench.py            # the table
    python benchmarks/openai_bench.py --json out.json
    python benchmarks/openai_bench.py --quick    # a short run (CI smoke)
    python benchmarks/openai_bench.py --roder "env PYTHONPATH=... python -m roder_runtime"
        # another checkout's roder (run from outside this one: its directory would win)
    python benchmarks/openai_bench.py --against "env PYTHONPATH=... python -m roder_runtime"
        # an A/B: two servers interleaved (the paired median of B - A, new conversations)
    RODER_EVENT_LOOP=asyncio python benchmarks/openai_bench.py
        # roder serve on asyncio's loop instead of uvloop (the server keeps that variable)

Target: Roder adds at most 5 ms at p50.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionChunk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve_common import server_env  # noqa: E402 - after the path setup

PREFIX = "roder serve: listening on "
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def start_katan() -> tuple[subprocess.Popen[bytes], str]:
    """Start llm-katan (echo backend) on a free port; return it and its ``/v1`` URL."""
    katan = shutil.which("llm-katan", path=str(BIN)) or shutil.which("llm-katan")
    if katan is None:
        raise SystemExit("llm-katan is not installed (pip install llm-katan)")
    port = _free_port()
    proc = subprocess.Popen(
        [katan, "-m", "tiny-echo", "--backend", "echo", "--providers", "openai"]
        + ["-h", "127.0.0.1", "-p", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(f"http://127.0.0.1:{port}/health")
    return proc, f"http://127.0.0.1:{port}/v1"


def start_roder(
    home: Path, engine_url: str, command: Sequence[str] = ()
) -> tuple[subprocess.Popen[str], str]:
    """Start ``roder serve --port 0`` on a JSONL store; return it and its ``/v1`` URL.

    ``command`` starts ``roder`` (default: the one installed beside this Python).
    """
    config = home / "config.toml"
    config.write_text(
        f'[thread_store]\nbackend = "jsonl"\npath = "{home / "threads"}"\n'
        f'[engines.openai-chat]\nbase_url = "{engine_url}"\napi_key_env = "BENCH_KATAN_KEY"\n'
    )
    env = server_env({"RODER_HOME": str(home / "home"), "BENCH_KATAN_KEY": "local"})
    proc = subprocess.Popen(
        [*(command or [str(BIN / "roder")]), "--config", str(config), "serve", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if not line.startswith(PREFIX):
        raise RuntimeError(f"roder serve said: {line!r}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    url = line[len(PREFIX) :].strip()
    _wait(url + "/healthz")
    return proc, url + "/v1"


def direct_ttft(client: openai.OpenAI, messages: list[dict[str, str]] | None = None) -> float:
    """Return seconds to the first content delta of a streamed chat completion.

    ``messages`` is the conversation so far (None: one new message). The stream is read
    to its end after the figure is taken (untimed), and with ``messages`` the user message
    and the whole reply are added to it: the next call sends what the engine gets through
    Roder in a conversation (its history, then the new input).

    The body is the one Roder's ``openai-chat`` engine sends, posted with the SDK's own
    ``post`` and read with its own ``Stream`` of ``ChatCompletionChunk`` s:
    ``chat.completions.create`` would first walk every message of the history through
    the SDK's parameter transform (about a millisecond per turn of history here), a cost
    of sending the whole conversation from the client that a Roder client never pays,
    and not the engine's.
    """
    sent = [*(messages or ()), {"role": "user", "content": "hello bench"}]
    body = {
        "model": "tiny-echo",
        "messages": sent,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    text = ""
    stream = client.post(
        "/chat/completions",
        body=body,
        cast_to=ChatCompletionChunk,
        stream=True,
        stream_cls=openai.Stream[ChatCompletionChunk],
    )
    with stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter() - start
                text += chunk.choices[0].delta.content
    if first is None:
        raise RuntimeError("no content delta")
    if messages is not None:
        messages += [sent[-1], {"role": "assistant", "content": text}]
    return first


def roder_ttft(client: openai.OpenAI, conversation: str | None) -> float:
    """Return seconds to the first ``response.output_text.delta`` through roder serve.

    The stream is read to ``response.completed`` after the figure is taken (untimed), so
    the next response does not queue behind this one's turn.
    """
    extra: dict[str, Any] = {"conversation": conversation} if conversation else {}
    start = time.perf_counter()
    first: float | None = None
    stream = client.responses.create(
        model="openai-chat/tiny-echo", input="hello bench", stream=True, **extra
    )
    with stream:
        for event in stream:
            if event.type == "response.output_text.delta" and first is None:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no output_text delta")
    return first


def cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) process ``pid`` has used (Linux; else 0)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alternate(runs: list[Callable[[], float]], n: int) -> list[list[float]]:
    """Return ``n`` timings of each run, taken in turn after two warm-up rounds: each pair
    of rows sees the same load and, in a conversation, the same history length.

    Two runs go A B, B A, A B, ... (so that neither always goes first). Three (the
    baseline D and two servers, an A/B) go D A B, D B A, ...: each server follows the
    other as often as it follows D, and never itself. (D A B, B A D, ... put A always in
    the middle and B after B every other round, warm: an A/A run of one roder against
    itself read 0.1-0.3 ms in B's favour.)"""
    for _ in range(2):
        for run in runs:
            run()
    times: list[list[float]] = [[] for _ in runs]
    order = list(enumerate(runs))
    if len(runs) > 2:
        orders = [order, [order[0], *order[:0:-1]]]
    else:
        orders = [order, order[::-1]]
    for round_ in range(n):
        for index, run in orders[round_ % 2]:
            times[index].append(run())
    return times


def summary(name: str, times: list[float]) -> dict[str, Any]:
    """Return the row of one measurement (ms)."""
    ordered = sorted(times)
    return {
        "workload": name,
        "n": len(times),
        "p50_ms": statistics.median(ordered) * 1e3,
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3,
    }


def _paired_ms(direct: list[float], through: list[float]) -> float:
    """Return the median of ``through[i] - direct[i]`` (ms)."""
    return statistics.median(b - a for a, b in zip(direct, through, strict=True)) * 1e3


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def measure(n: int, command: Sequence[str] = ()) -> dict[str, Any]:
    """Run O1 with ``n`` timings a row (``command`` starts roder, as ``--roder``); return
    the rows (``added_p50_ms``, ``added_paired_p50_ms`` on the Roder rows) and the load."""
    katan, engine_url = start_katan()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            roder, roder_url = start_roder(Path(tmp), engine_url, command)
            try:
                direct = openai.OpenAI(base_url=engine_url, api_key="local", max_retries=0)
                through = openai.OpenAI(base_url=roder_url, api_key="local", max_retries=0)
                used = cpu_s(roder.pid)
                new_direct, new_roder = alternate(
                    [lambda: direct_ttft(direct), lambda: roder_ttft(through, None)], n
                )
                # What the server process spent per response, whole (not only to the first
                # delta; warm-ups included): a figure the machine's load does not inflate.
                new_cpu = (cpu_s(roder.pid) - used) / (n + 2) * 1e3
                # The same conversation both ways: the direct client sends the whole history
                # the engine gets through Roder (each turn's input and reply), turn for turn.
                conversation = through.conversations.create().id
                history: list[dict[str, str]] = []
                used = cpu_s(roder.pid)
                runs = [
                    lambda: direct_ttft(direct, history),
                    lambda: roder_ttft(through, conversation),
                ]
                conv_direct, conv_roder = alternate(runs, n)
                conv_cpu = (cpu_s(roder.pid) - used) / (n + 2) * 1e3
                rows = [
                    summary("O1 direct, one message", new_direct),
                    summary("O1 roder serve, new conversation", new_roder),
                    summary("O1 direct, the whole conversation", conv_direct),
                    summary("O1 roder serve, one conversation", conv_roder),
                ]
            finally:
                roder.terminate()
                roder.wait(20)
    finally:  # also when roder serve did not start
        katan.terminate()
        katan.wait(10)
    pairs = [(new_direct, new_roder), (conv_direct, conv_roder)]
    for index, row in enumerate(rows):
        base = rows[index - index % 2]["p50_ms"]  # each Roder row against the row before it
        row["added_p50_ms"] = row["p50_ms"] - base
        # The median of the differences of the pairs taken together (same minute, same
        # history length): less noisy than the difference of the medians.
        row["added_paired_p50_ms"] = 0.0 if index % 2 == 0 else _paired_ms(*pairs[index // 2])
        if index % 2:
            row["met"] = row["added_p50_ms"] <= 5
    rows[1]["server_cpu_ms_per_response"] = new_cpu
    rows[3]["server_cpu_ms_per_response"] = conv_cpu
    return {"rows": rows, "load": os.getloadavg()[0]}


def measure_against(
    n: int, against: Sequence[str], command: Sequence[str] = (), *, conversation: bool = False
) -> dict[str, Any]:
    """A/B two roders on one llm-katan, a new conversation per response: ``against`` (A)
    and ``command`` (B, default the installed roder), requests interleaved D A B, D B A,
    ... (see :func:`alternate`); return each one's added p50 and the paired median of
    B - A, which the machine's drift (minutes apart) does not move as it moves two runs.

    ``conversation``: each server answers one conversation instead, turn after turn (the
    direct client sends the same growing history, as in :func:`measure`)."""
    katan, engine_url = start_katan()
    try:
        with tempfile.TemporaryDirectory() as tmp_a, tempfile.TemporaryDirectory() as tmp_b:
            roder_a, url_a = start_roder(Path(tmp_a), engine_url, against)
            roder_b, url_b = start_roder(Path(tmp_b), engine_url, command)
            try:
                direct = openai.OpenAI(base_url=engine_url, api_key="local", max_retries=0)
                first = openai.OpenAI(base_url=url_a, api_key="local", max_retries=0)
                second = openai.OpenAI(base_url=url_b, api_key="local", max_retries=0)
                history: list[dict[str, str]] | None = [] if conversation else None
                conv_a = first.conversations.create().id if conversation else None
                conv_b = second.conversations.create().id if conversation else None
                base, a, b = (
                    (lambda: direct_ttft(direct, history)),
                    (lambda: roder_ttft(first, conv_a)),
                    (lambda: roder_ttft(second, conv_b)),
                )
                d_times, a_times, b_times = alternate([base, a, b], n)  # D A B, then D B A, ...
            finally:
                for proc in (roder_a, roder_b):
                    proc.terminate()
                    proc.wait(20)
    finally:
        katan.terminate()
        katan.wait(10)
    direct_p50 = statistics.median(d_times) * 1e3
    return {
        "n": n,
        "workload": "one conversation" if conversation else "new conversation",
        "direct_p50_ms": direct_p50,
        "a_added_p50_ms": statistics.median(a_times) * 1e3 - direct_p50,
        "b_added_p50_ms": statistics.median(b_times) * 1e3 - direct_p50,
        "paired_b_minus_a_ms": _paired_ms(a_times, b_times),
        "load": os.getloadavg()[0],
    }


def print_rows(result: dict[str, Any]) -> None:
    """Print the table of :func:`measure`'s result."""
    rows = result["rows"]
    print(f"{'workload (SDK time to first delta)':<40} {'n':>5} {'p50 ms':>8} {'p90 ms':>8} "
          f"{'added p50':>10} {'paired':>7} {'target':>8} {'met':>4}")  # fmt: skip
    for row in rows:
        target, met = ("<= 5", _met(row["met"])) if "met" in row else ("-", "-")
        print(f"{row['workload']:<40} {row['n']:>5} {row['p50_ms']:>8.2f} {row['p90_ms']:>8.2f} "
              f"{row['added_p50_ms']:>10.2f} {row['added_paired_p50_ms']:>7.2f} {target:>8} "
              f"{met:>4}")  # fmt: skip
    print(f"roder serve CPU per response (whole): new conversation "
          f"{rows[1]['server_cpu_ms_per_response']:.1f} ms, one conversation "
          f"{rows[3]['server_cpu_ms_per_response']:.1f} ms")  # fmt: skip
    print(f"load average: {result['load']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--roder",
        metavar="COMMAND",
        help="the command that starts roder (for an A/B against another checkout, e.g. "
        '"env PYTHONPATH=... python -m roder_runtime"; default: the installed roder)',
    )
    parser.add_argument(
        "--against",
        metavar="COMMAND",
        help="A/B: this roder (A) against --roder or the installed one (B), two servers "
        "interleaved, new conversations; prints the paired median of B - A",
    )
    parser.add_argument(
        "--conversation",
        action="store_true",
        help="with --against: one conversation on each server, not a new one per response",
    )
    args = parser.parse_args()
    command = shlex.split(args.roder) if args.roder else ()
    if args.against:
        result = measure_against(
            10 if args.quick else 300,
            shlex.split(args.against),
            command,
            conversation=args.conversation,
        )
        print(f"{result['workload']}: direct p50 {result['direct_p50_ms']:.2f} ms; added p50: A "
              f"{result['a_added_p50_ms']:+.2f}, B {result['b_added_p50_ms']:+.2f}; paired B - A "
              f"{result['paired_b_minus_a_ms']:+.2f} ms (n = {result['n']})")  # fmt: skip
    else:
        result = measure(10 if args.quick else 100, command)
        print_rows(result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**result, "quick": args.quick}, out, indent=2)


if __name__ == "__main__":
    main()
