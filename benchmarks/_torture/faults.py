"""Disk faults: writes and syncs failing with ENOSPC and EIO, short writes.

Two ways in, both real to the store:

- a child process whose ``os.write`` / ``os.fsync`` / ``os.fdatasync`` fail on cue
  (:mod:`_torture.faultchild`), for EIO, short writes and a disk filling mid-record;
- a small tmpfs mounted for the trial, filled up, for a real ``ENOSPC`` from the kernel
  (needs the right to mount; the trial is skipped with the reason otherwise).

Each trial checks: the failed commit raised a ``StoreError`` (a clear error), nothing of it
is visible to a fresh store, every commit acknowledged before it is intact, and the store
commits again once the fault is gone.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson

from roder_api.errors import RoderError, StoreError
from roder_api.events import JournalEvent
from roder_api.threads import ThreadMetadata

from .checks import ThreadState, check_batches, check_journal
from .child import batch_events
from .stats import KindStats
from .stores import StoreSpec

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent

INJECTED_FAULTS: dict[str, dict[str, Any]] = {
    "write EIO": {"op": "write", "error": "EIO", "short": False},
    "write ENOSPC": {"op": "write", "error": "ENOSPC", "short": False},
    "fsync EIO": {"op": "fsync", "error": "EIO", "short": False},
    "short write": {"op": "write", "error": None, "short": True},
    "short write, then ENOSPC": {"op": "write", "error": "ENOSPC", "short": True},
}
"""The faults injected through the child's wrapped system calls."""


async def _new_thread(spec: StoreSpec) -> str:
    store = await spec.factory().open()
    try:
        thread_id = "fault-" + uuid.uuid4().hex[:12]
        now = int(time.time() * 1000)
        await store.create_thread(ThreadMetadata(thread_id, now, now))
        return thread_id
    finally:
        await store.aclose()


async def _read_back(
    spec: StoreSpec, thread_id: str
) -> tuple[ThreadMetadata, list[JournalEvent], list[JournalEvent]]:
    store = await spec.factory().open()
    try:
        return (
            await store.get_thread(thread_id),
            await store.read_events(thread_id),
            await store.replay_events(thread_id),
        )
    finally:
        await store.aclose()


def _check_outcome(
    stats: KindStats,
    thread_id: str,
    committed: list[dict[str, Any]],
    failed: list[str],
    read: tuple[ThreadMetadata, list[JournalEvent], list[JournalEvent]],
) -> None:
    metadata, events, replay = read
    state = ThreadState()
    for entry in committed:
        state.acked[entry["b"]] = (entry["s"], entry["n"])
    check_batches(stats, thread_id, state, metadata, events)
    check_journal(stats, thread_id, state, metadata, events, replay)
    visible = {getattr(e.event, "turn_id", None) for e in events}
    for batch_id in failed:
        if batch_id in visible:
            # Whole (check_batches saw no half batch) but reported as failed: the fault hit
            # after the record was durable. Not a loss; noted, as a caller may retry it.
            stats.notes["failed but whole"] = stats.notes.get("failed but whole", 0) + 1


async def run_injected_faults(
    spec: StoreSpec, trials: int, *, seed: int = 0, backends: tuple[str, ...] = ("asyncio", "trio")
) -> list[KindStats]:
    """Run ``trials`` trials of every injected fault against ``spec``."""
    rng = random.Random(seed)
    results = []
    for name, fault in INJECTED_FAULTS.items():
        stats = KindStats(f"{name} / {spec.name}")
        if fault["op"] == "fsync" and spec.settings.get("durability") == "none":
            stats.skipped = "durability none never syncs"
            results.append(stats)
            continue
        for number in range(trials):
            thread_id = await _new_thread(spec)
            plan = {
                **fault,
                "spec": asdict(spec),
                "thread_id": thread_id,
                "seed": seed * 10_000 + number,
                # The first trial faults the very first write or sync of a fresh process
                # (before any commit: session markers, directories); the others at random.
                "before": rng.randint(0, 3) if number else 0,
                "skip": rng.choice((0, 0, 0, 1, 2)) if number else 0,
                "backend": backends[number % len(backends)],
            }
            outcome = _run_fault_child(plan)
            stats.trials += 1
            stats.faults += outcome["injected"]
            committed = outcome["committed"]
            stats.acked += len(committed)
            failed = [a["b"] for a in outcome["attempts"] if a["error"]]
            for attempt in outcome["attempts"]:
                error = attempt["error"]
                if error is None:
                    continue
                if error.startswith("!") or error not in _STORE_ERRORS:
                    stats.problem(
                        f"{stats.kind}: {error.lstrip('!')} instead of a StoreError: "
                        f"{attempt['message']}",
                        corrupt=1,
                    )
            post = [a for a in outcome["attempts"] if a["b"].startswith("post")]
            if not post or post[0]["error"]:
                stats.problem(f"{stats.kind}: the store did not work again: {post}", corrupt=1)
            try:
                read = await _read_back(spec, thread_id)
            except RoderError as exc:
                stats.problem(f"{stats.kind}: reading back failed: {exc!r}", corrupt=1)
                continue
            _check_outcome(stats, thread_id, committed, failed, read)
        results.append(stats)
    return results


_STORE_ERRORS: set[str] = {StoreError.__name__} | {c.__name__ for c in StoreError.__subclasses__()}


def _run_fault_child(plan: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCHMARKS_DIR), env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [sys.executable, "-m", "_torture.faultchild", orjson.dumps(plan).decode()],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"fault child failed ({done.returncode}): {done.stderr.decode()}")
    result: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return result


# --- a real ENOSPC from a full tmpfs -------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "512k") -> Iterator[None]:
    """Mount a tmpfs of ``size`` on ``path`` for the block; raise OSError if not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"cannot mount a tmpfs: {done.stderr.decode().strip() or done.returncode}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill_disk(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; return the filler file."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as file:
        while True:
            try:
                written = file.write(chunk)
            except OSError:
                break
            if not written:
                break
        # tmpfs may still take a few bytes; take them one at a time.
        while True:
            try:
                if not file.write(b"\0"):
                    break
            except OSError:
                break
    return filler


async def run_enospc(spec_for: Any, mount_dir: Path, trials: int, *, seed: int = 0) -> KindStats:
    """Fill a real tmpfs under the store and append: ``spec_for(path)`` gives the store.

    Each trial commits a few batches, fills the disk, tries commits of several sizes (each
    either whole or a ``StoreError`` with nothing visible), frees the space and commits again.
    """
    rng = random.Random(seed)
    probe = spec_for(mount_dir / "store")
    stats = KindStats(f"ENOSPC (tmpfs) / {probe.name}")
    try:
        mount_ctx = small_tmpfs(mount_dir)
        mount_ctx.__enter__()
    except OSError as exc:
        stats.skipped = str(exc)
        return stats
    try:
        for number in range(trials):
            await _enospc_trial(stats, spec_for(mount_dir / f"t{number}"), mount_dir, number, rng)
            if not stats.ok:
                break
    finally:
        mount_ctx.__exit__(None, None, None)
    return stats


async def _enospc_trial(
    stats: KindStats, spec: StoreSpec, mount_dir: Path, number: int, rng: random.Random
) -> None:
    store = await spec.factory().open()
    committed: list[dict[str, Any]] = []
    failed: list[str] = []
    thread_id = "enospc-" + uuid.uuid4().hex[:12]
    now = int(time.time() * 1000)
    await store.create_thread(ThreadMetadata(thread_id, now, now))

    async def append(batch_id: str, size: int) -> bool:
        events, _ = batch_events(batch_id, size, rng)
        try:
            entries = await store.append_events(thread_id, events)
        except StoreError:
            failed.append(batch_id)
            return False
        except Exception as exc:  # noqa: BLE001 - an unclear error is the finding
            stats.problem(
                f"{stats.kind}: {type(exc).__name__} instead of a StoreError: {exc}", corrupt=1
            )
            failed.append(batch_id)
            return False
        committed.append({"b": batch_id, "s": entries[0].sequence, "n": len(events)})
        return True

    for index in range(rng.randint(1, 3)):
        await append(f"pre{number}.{index}", rng.randint(1, 4))
    filler = await anyio.to_thread.run_sync(fill_disk, mount_dir)
    for index in range(4):
        if not await append(f"full{number}.{index}", rng.randint(1, 6)):
            stats.faults += 1
    # A thread created on a full disk must fail cleanly too.
    try:
        await store.create_thread(ThreadMetadata("enospc-new-" + uuid.uuid4().hex[:8], now, now))
    except StoreError:
        stats.faults += 1
    except Exception as exc:  # noqa: BLE001 - an unclear error is the finding
        stats.faults += 1
        stats.problem(
            f"{stats.kind}: create_thread on a full disk raised {type(exc).__name__} instead "
            f"of a StoreError: {exc}",
            corrupt=1,
        )
    await anyio.Path(filler).unlink()
    if not await append(f"post{number}", 2):
        stats.problem(f"{stats.kind}: no commit after space returned", corrupt=1)
    await store.aclose()
    stats.trials += 1
    stats.acked += len(committed)
    read = await _read_back(spec, thread_id)
    _check_outcome(stats, thread_id, committed, failed, read)
