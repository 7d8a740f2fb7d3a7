"""Lease trials: a holder whose lease is taken from under it, and a holder's forked child.

**Lost lease connection** (PostgreSQL). A child (``lease_child.py``) holds a session and
streams turns, acknowledging every delivered event. After a random delay the parent ends
the lease's backend with ``pg_terminate_backend`` (what a server restart or a network cut
does to it), takes the thread over with a session of its own (which closes the dead turn
by the crash rules) and runs a turn. Counted: every acknowledged event must be in the
journal at its sequence (else *lost*); nothing of the holder may land after the takeover
began, sequences stay consecutive, and the holder must stop saying its lease was lost
(else *corrupt*).

**Forked child holding descriptors** (every store). The holder forks a background job that
inherits every descriptor, then is SIGKILLed at a random moment while the job runs on. The
thread must be free at once: a session opens within the deadline (else *corrupt*: the
lease outlived its holder), closes the dead turn and runs one; acknowledged events must
all be there (else *lost*).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import anyio.to_thread
import orjson

from _torture.stats import KindStats
from _torture.stores import StoreSpec
from roder_api import ExtensionRegistryBuilder
from roder_api.errors import ThreadBusyError
from roder_api.events import JournalEvent, TurnAborted, TurnComplete
from roder_api.testing import ScriptedEngine
from roder_runtime import Runtime, RuntimeConfig, UserInput

CHILD = Path(__file__).with_name("lease_child.py")
TAKEOVER_DEADLINE_S = 10.0
"""How long the taker may wait for a thread whose holder is gone."""


def _runtime(spec: StoreSpec) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(spec.factory())
    return Runtime(builder.build(), RuntimeConfig(), name="taker")


def _spec_json(spec: StoreSpec) -> str:
    return orjson.dumps(
        {"name": spec.name, "backend": spec.backend, "settings": spec.settings}
    ).decode()


def _start(
    mode: str, spec: StoreSpec, thread_id: str, ack: Path
) -> tuple[subprocess.Popen[str], int]:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), mode, _spec_json(spec), thread_id, str(ack)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline().split()
    if line[:1] != ["ready"]:
        _, err = child.communicate(timeout=30)
        raise RuntimeError(f"the lease child did not start: {line} {err[-2000:]}")
    return child, int(line[1])


def _terminate_lease_backend(dsn: str, schema: str, thread_id: str) -> bool:
    """End the backend holding the thread's advisory lock; return False when none did."""
    import psycopg

    key = f"roder-lease:{schema}:{thread_id}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT l.pid FROM pg_locks l, (SELECT hashtextextended(%s, 0) AS k) h"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            " AND l.classid = ((h.k >> 32) & 4294967295)::oid"
            " AND l.objid = (h.k & 4294967295)::oid",
            (key,),
        ).fetchone()
        if row is None:
            return False
        conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        return True


def _acks(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    acked = []
    for line in path.read_text().splitlines():
        seq, _, turn = line.partition(" ")
        if seq.isdigit():
            acked.append((int(seq), turn))
    return acked


TAKER_TURN_DEADLINE_S = 20.0
"""How long the taker's own turn may take (a dead holder's lock still held stalls it)."""


async def _take_over(runtime: Runtime, thread_id: str) -> tuple[int | None, float, bool]:
    """Open a session on the thread as soon as it is free, let it close the dead turn and
    run a turn; return the sequence of its first event (None: it never got the thread),
    the seconds it took, and whether its turn ended in time."""
    began = time.perf_counter()
    deadline = began + TAKEOVER_DEADLINE_S
    while True:
        try:
            session = await runtime.start_session(thread_id)
        except ThreadBusyError:
            if time.perf_counter() > deadline:
                return None, time.perf_counter() - began, False
            await anyio.sleep(0.05)
            continue
        break
    first: int | None = None
    ended = False
    async with session:
        with anyio.move_on_after(TAKER_TURN_DEADLINE_S):
            turn_id = await session.submit(UserInput("taken over"))
            while not ended:
                entry = await session.next_event()
                first = entry.sequence if first is None else first
                event = entry.event
                ended = isinstance(event, (TurnComplete, TurnAborted)) and event.turn_id == turn_id
    return first if ended else -1, time.perf_counter() - began, ended


def _check(
    stats: KindStats,
    label: str,
    events: list[JournalEvent],
    acked: list[tuple[int, str]],
    taken_at: int | None,
) -> None:
    by_seq = {e.sequence: e for e in events}
    if [e.sequence for e in events] != list(range(1, len(events) + 1)):
        stats.problem(f"{label}: sequences are not consecutive", corrupt=1)
    stats.acked += len(acked)
    missing = [
        seq
        for seq, turn in acked
        if seq not in by_seq
        or (turn != "-" and getattr(by_seq[seq].event, "turn_id", None) != turn)
    ]
    if missing:
        stats.problem(f"{label}: acknowledged events missing: {missing[:5]}", lost=len(missing))
    if taken_at is None:
        return
    holder_turns = {getattr(e.event, "turn_id", None) for e in events if e.sequence < taken_at}
    holder_turns.discard(None)
    # The taker's first events close the holder's open turn (crash rules): allowed.
    late = [
        e.sequence
        for e in events
        if e.sequence >= taken_at
        and getattr(e.event, "turn_id", None) in holder_turns
        and not _closing(e)
    ]
    if late:
        stats.problem(
            f"{label}: the old holder wrote after the takeover: {late[:5]}", corrupt=len(late)
        )


def _closing(entry: JournalEvent) -> bool:
    from roder_api.events import ItemCompleted
    from roder_api.transcript import AssistantMessage, UserMessage

    event = entry.event
    if isinstance(event, TurnAborted):
        return True
    return isinstance(event, ItemCompleted) and isinstance(
        event.item, (AssistantMessage, UserMessage)
    )


async def _events(spec: StoreSpec, thread_id: str) -> list[JournalEvent]:
    async with _runtime(spec) as runtime:
        return list((await runtime.event_page(thread_id, limit=1_000_000)).events)


def _finish(child: subprocess.Popen[str], wait_s: float) -> str:
    """Return what the child printed after ``ready``, killing it after ``wait_s``."""
    try:
        out, _ = child.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate(timeout=30)
    return out


async def _judged_take_over(
    stats: KindStats,
    runtime: Runtime,
    thread_id: str,
    busy: str,
    stalled: str,
    *,
    number: int,
) -> tuple[int | None, bool]:
    """Take the thread over, count the recovery time, and count a busy or stalled taker."""
    taken_at, took, ended = await _take_over(runtime, thread_id)
    stats.recovery_ms.append(took * 1000)
    if taken_at is None:
        stats.problem(f"trial {number}: {busy}", corrupt=1)
    elif not ended:
        stats.problem(f"trial {number}: {stalled}", corrupt=1)
    return taken_at, ended


def _stop(child: subprocess.Popen[str], job: int = 0) -> None:
    """Kill what a trial left running (the holder, its forked job) and close its pipes."""
    if child.poll() is None:
        child.kill()
        child.wait(30)
    if job > 0 and _alive(job):
        os.kill(job, signal.SIGKILL)
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


async def run_lease_lost_trials(
    spec: StoreSpec, trials: int, workdir: Path, *, seed: int = 0, max_delay: float = 0.5
) -> KindStats:
    """Run ``trials`` lost-lease-connection trials on a PostgreSQL ``spec``."""
    stats = KindStats(f"lease lost / {spec.name}")
    rng = random.Random(seed)
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    async with _runtime(spec) as runtime:
        for number in range(trials):
            thread_id = (await runtime.create_thread()).thread_id
            ack = workdir / f"{thread_id}.acks"
            child, _ = await anyio.to_thread.run_sync(_start, "hold", spec, thread_id, ack)
            try:
                await anyio.sleep(rng.uniform(0.05, max_delay))
                ended = await anyio.to_thread.run_sync(
                    _terminate_lease_backend,
                    spec.settings["dsn"],
                    spec.settings["schema"],
                    thread_id,
                )
                stats.faults += int(ended)
                taken_at, ended = await _judged_take_over(
                    stats,
                    runtime,
                    thread_id,
                    "the thread stayed busy",
                    "the taker's turn stalled",
                    number=number,
                )
                out = await anyio.to_thread.run_sync(_finish, child, 15.0)
            finally:
                _stop(child)
            stats.trials += 1
            if "lost " not in out:
                stats.problem(f"trial {number}: the holder did not stop: {out[-300:]!r}", corrupt=1)
            elif "lease" not in out:
                stats.problem(
                    f"trial {number}: the holder stopped without naming the lease: {out[-300:]!r}",
                    corrupt=1,
                )
            taken = taken_at if ended else None
            _check(stats, f"trial {number}", await _events(spec, thread_id), _acks(ack), taken)
    return stats


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def run_forked_child_trials(
    spec: StoreSpec, trials: int, workdir: Path, *, seed: int = 0, max_delay: float = 0.5
) -> KindStats:
    """Run ``trials`` SIGKILLs of a holder whose forked job runs on; return the counts."""
    stats = KindStats(f"forked child / {spec.name}")
    rng = random.Random(seed)
    await anyio.Path(workdir).mkdir(parents=True, exist_ok=True)
    async with _runtime(spec) as runtime:
        for number in range(trials):
            thread_id = (await runtime.create_thread()).thread_id
            ack = workdir / f"{thread_id}.acks"
            child, job = await anyio.to_thread.run_sync(_start, "fork", spec, thread_id, ack)
            try:
                await anyio.sleep(rng.uniform(0.05, max_delay))
                child.kill()  # SIGKILL
                await anyio.to_thread.run_sync(child.wait, 30)
                stats.faults += int(job > 0 and _alive(job))
                await _judged_take_over(
                    stats,
                    runtime,
                    thread_id,
                    "the lease outlived its SIGKILLed holder (its forked child still held it)",
                    f"the taker could not write for {TAKER_TURN_DEADLINE_S:g} s (a lock of the "
                    "SIGKILLed holder was still held by its forked child)",
                    number=number,
                )
            finally:
                _stop(child, job)
            stats.trials += 1
            _check(stats, f"trial {number}", await _events(spec, thread_id), _acks(ack), None)
    return stats


def skipped(kind: str, why: str) -> KindStats:
    """Return the row of a kind that could not run here, saying why."""
    return KindStats(kind, skipped=why)


def lease_specs(specs: list[StoreSpec]) -> list[StoreSpec]:
    """Return the stores the forked-child trials run on: one JSONL, SQLite, PostgreSQL."""
    chosen: list[StoreSpec] = []
    for spec in specs:
        if spec.backend == "jsonl" and any(s.backend == "jsonl" for s in chosen):
            continue
        chosen.append(spec)
    return chosen


__all__ = ["lease_specs", "run_forked_child_trials", "run_lease_lost_trials", "skipped"]
