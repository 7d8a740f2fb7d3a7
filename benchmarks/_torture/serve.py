"""The ``serve`` mode: SIGKILL ``roder serve`` at random moments during runs and streams,
restart it on the same port, and count accepted runs lost and events duplicated,
reordered or gapped on the streams that resumed (Last-Event-ID) across the restart.

Each trial posts 1-3 runs to a thread (an accepted run is one answered 202), keeps a
stream open on it that reconnects by itself from the last id it saw, kills the server
0-1.5 s later (mid-run, mid-stream, or while a run is being posted), restarts it, and
waits until every accepted run is completed or aborted. One trial in four is *long*: runs
of 100-400 words, killed 1.6-4 s in (80-200 events of the first reply journaled, more than
a pick-up reading a fixed tail of the journal would see), so the restarted server must
find the thread by its store query however long the dead turn was. Then: an accepted run the
journal never answers is *lost*; a streamed sequence that is not the one after the last
(duplicate, reorder, gap) or whose event differs from the journal is *corrupt*.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from _torture.stats import KindStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _serve_common import ServeProcess, postgres_dsn  # noqa: E402 - after the path setup

_ANSWER_S = 60.0
"""How long accepted runs get to end after the restart."""

SHORT_WORDS, LONG_WORDS = (5, 40), (100, 400)
"""Words in a run's reply (one journaled event each, 20 ms apart): short and long trials."""

SHORT_KILL_S, LONG_KILL_S = (0.0, 1.5), (1.6, 4.0)
"""When the server is killed after a trial starts: short and long trials."""


class _Reader:
    """A stream on one thread that reconnects from its last id until told to stop."""

    def __init__(self, server: ServeProcess, thread_id: str, after: int) -> None:
        self.server = server
        self.thread_id = thread_id
        self.last = after
        self.got: list[tuple[int, bytes]] = []
        self.stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            url = f"http://127.0.0.1:{self.server.port}/v1/threads/{self.thread_id}/stream"
            headers = {"Last-Event-ID": str(self.last)}
            try:
                with httpx.stream(
                    "GET", url, headers=headers, timeout=httpx.Timeout(5, read=2)
                ) as response:
                    if response.status_code != 200:
                        time.sleep(0.05)
                        continue
                    self.connections += 1
                    message_id: int | None = None
                    for line in response.iter_lines():
                        if self.stop.is_set():
                            return
                        if line.startswith("id:"):
                            message_id = int(line[3:].strip())
                        elif line.startswith("data:") and message_id is not None:
                            self.got.append((message_id, line[5:].strip().encode()))
                            self.last = max(self.last, message_id)
                            message_id = None
            except httpx.HTTPError:
                time.sleep(0.05)  # the server is down or restarting: reconnect

    def join(self) -> None:
        """Stop reading and wait for the reader."""
        self.stop.set()
        self._thread.join(10)


def _journal(client: httpx.Client, thread_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = client.get(f"/v1/threads/{thread_id}/events", params={"after": len(events)})
        batch = page.json()["events"]
        if not batch:
            return events
        events.extend(batch)


SERVE_BACKENDS = ("jsonl", "sqlite", "postgres")
"""The stores the serve mode runs on (PostgreSQL when it answers)."""


def serve_backends() -> list[tuple[str, str]]:
    """Return ``(backend, dsn)`` for each store the serve mode can run on here (the dsn
    empty but for PostgreSQL; SQLite when its plugin is installed)."""
    import importlib.metadata

    installed = {ep.name for ep in importlib.metadata.entry_points(group="roder")}
    found = [("jsonl", "")]
    if "sqlite" in installed:
        found.append(("sqlite", ""))
    dsn = postgres_dsn() if "postgres" in installed else None
    if dsn is not None:
        found.append(("postgres", dsn))
    return found


def run_serve_trials(
    trials: int, workdir: Path, *, seed: int, backend: str = "jsonl", dsn: str = ""
) -> KindStats:
    """Run ``trials`` kill trials against ``roder serve`` on ``backend`` (PostgreSQL: on
    ``dsn``, in a schema of its own, dropped afterwards); return the counts."""
    stats = KindStats(f"serve / {backend}")
    rng = random.Random(seed)
    schema = f"roder_torture_serve_{uuid.uuid4().hex[:10]}" if backend == "postgres" else ""
    server = ServeProcess(workdir / backend, backend, delta_delay_ms=20, dsn=dsn, schema=schema)
    try:
        return _trials(server, stats, rng, trials)
    finally:
        server.stop()
        server.drop_schema()


def _trials(server: ServeProcess, stats: KindStats, rng: random.Random, trials: int) -> KindStats:
    server.start()
    crash_aborts = 0
    reconnects = 0
    long_trials = 0
    try:
        for number in range(trials):
            with httpx.Client(base_url=server.url, timeout=30) as c:
                tid = c.post("/v1/threads", json={}).json()["thread_id"]
            reader = _Reader(server, tid, 0)
            accepted: list[str] = []
            long_trial = number % 4 == 1  # the second trial of every four (quick runs: one)
            long_trials += long_trial
            kill_at = time.monotonic() + rng.uniform(*(LONG_KILL_S if long_trial else SHORT_KILL_S))
            killer = threading.Timer(max(0.0, kill_at - time.monotonic()), server.kill)
            killer.start()
            count = rng.randint(*(LONG_WORDS if long_trial else SHORT_WORDS))
            words = " ".join(f"w{i}" for i in range(count))
            for run in range(rng.randint(1, 3)):
                turn_id = f"t{number}-{run}"
                try:
                    response = httpx.post(
                        f"{server.url}/v1/threads/{tid}/runs",
                        json={"input": words, "turn_id": turn_id},
                        timeout=10,
                    )
                except httpx.HTTPError:
                    break  # killed while posting: not accepted, so not counted
                if response.status_code == 202:
                    accepted.append(turn_id)
            killer.join()
            server.kill()
            stats.faults += 1
            restarted = time.perf_counter()
            server.start()
            stats.trials += 1
            stats.acked += len(accepted)
            deadline = time.monotonic() + _ANSWER_S
            with httpx.Client(base_url=server.url, timeout=30) as c:
                open_runs = set(accepted)
                while open_runs and time.monotonic() < deadline:
                    for turn_id in sorted(open_runs):
                        status = c.get(f"/v1/threads/{tid}/runs/{turn_id}")
                        if status.status_code == 200 and status.json()["status"] in (
                            "completed",
                            "aborted",
                        ):
                            open_runs.discard(turn_id)
                            crash_aborts += status.json()["status"] == "aborted"
                    time.sleep(0.05)
                stats.recovery_ms.append((time.perf_counter() - restarted) * 1000)
                for turn_id in sorted(open_runs):
                    stats.problem(f"trial {number}: accepted run {turn_id} never ended", lost=1)
                events = _journal(c, tid)
            # The stream catches up with the journal's end, then stops.
            catch_up = time.monotonic() + 20
            while reader.last < len(events) and time.monotonic() < catch_up:
                time.sleep(0.02)
            reader.join()
            reconnects += max(0, reader.connections - 1)
            by_sequence = {e["sequence"]: e for e in events}
            previous = 0
            for sequence, data in reader.got:
                if sequence != previous + 1:
                    what = "duplicated" if sequence <= previous else "gapped"
                    if sequence < previous:
                        what = "reordered"
                    stats.notes[what] = stats.notes.get(what, 0) + 1
                    stats.problem(
                        f"trial {number}: sequence {sequence} after {previous} ({what})", corrupt=1
                    )
                elif orjson.loads(data) != by_sequence.get(sequence):
                    stats.problem(f"trial {number}: event {sequence} differs", corrupt=1)
                previous = max(previous, sequence)
            if previous != len(events):
                stats.problem(
                    f"trial {number}: the stream stopped at {previous} of {len(events)}",
                    corrupt=1,
                )
    finally:
        server.stop()
    stats.notes["runs_aborted_by_the_crash"] = crash_aborts
    stats.notes["stream_reconnects"] = reconnects
    stats.notes["long_trials"] = long_trials
    return stats
