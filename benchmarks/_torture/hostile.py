"""Hostile journal files: truncation, bit flips, duplicated and reordered lines.

A journal is built through the store itself, damaged on disk, and opened by a fresh store.
The rules checked for every damage:

- reading raises nothing but a ``RoderError``;
- when reading succeeds, every record before the damage is there, unchanged, and what is
  read is a prefix of the original journal (a torn tail cut away), never invented data;
- a write after the damage either commits after that prefix or is refused with a
  ``RoderError``, leaving the file as it was;
- a checker (``fsck``, when given) reports every damage that changes what is read.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from roder_api.errors import RoderError
from roder_api.events import Event, ItemCompleted, JournalEvent, UsageUpdated
from roder_api.inference import TokenUsage
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage

from .stats import KindStats
from .stores import StoreSpec

THREAD_ID = "hostile-thread"


@dataclass(frozen=True)
class Mutation:
    """One damage: ``kind`` (truncate, flip, duplicate, swap) and its positions."""

    kind: str
    a: int
    b: int = 0

    def apply(self, lines: list[bytes]) -> bytes:
        """Return the journal ``lines`` (each with its newline) damaged by this mutation."""
        data = b"".join(lines)
        if self.kind == "truncate":
            return data[: self.a % (len(data) + 1)]
        if self.kind == "flip":
            position = self.a % len(data)
            flipped = data[position] ^ (1 << (self.b % 8))
            return data[:position] + bytes([flipped]) + data[position + 1 :]
        if self.kind == "duplicate":
            index = self.a % len(lines)
            return b"".join(lines[: index + 1] + [lines[index]] + lines[index + 1 :])
        if self.kind == "swap":
            i, j = self.a % len(lines), self.b % len(lines)
            swapped = list(lines)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            return b"".join(swapped)
        raise ValueError(f"unknown mutation {self.kind!r}")


def random_mutation(rng: random.Random) -> Mutation:
    """Return a random mutation (positions are reduced modulo the journal's size)."""
    kind = rng.choice(("truncate", "flip", "duplicate", "swap"))
    return Mutation(kind, rng.randrange(1 << 20), rng.randrange(1 << 20))


async def build_journal(spec: StoreSpec, batches: int = 8) -> tuple[Path, list[JournalEvent]]:
    """Create a thread with ``batches`` committed batches and a title; return its file."""
    store = await spec.factory().open()
    try:
        now = int(time.time() * 1000)
        await store.create_thread(ThreadMetadata(THREAD_ID, now, now))
        for number in range(batches):
            batch: list[Event] = [
                ItemCompleted(f"turn{number}", UserMessage(f"message {number} " + "é" * number)),
                UsageUpdated(f"turn{number}", TokenUsage(number + 1, 1, number + 2), "turn"),
            ]
            await store.append_events(THREAD_ID, batch[: 1 + number % 2])
            if number in (2, 5):
                # Two title changes: swapping their lines changes what the thread says.
                await store.update_thread(THREAD_ID, title=f"title {number}")
        events = await store.read_events(THREAD_ID)
        path = Path(getattr(store, "journal_path")(THREAD_ID))  # noqa: B009 - JSONL only
    finally:
        await store.aclose()
    return path, events


def split_lines(data: bytes) -> list[bytes]:
    """Return the lines of ``data``, each keeping its newline."""
    return data.splitlines(keepends=True)


def damaged_line(original: list[bytes], damaged: bytes) -> int:
    """Return the index of the first original line the damage touches (len: none)."""
    position = 0
    for index, line in enumerate(original):
        end = position + len(line)
        if damaged[position:end] != line:
            return index
        position = end
    return len(original)


def events_in_lines(events: list[JournalEvent], lines: list[bytes], upto: int) -> int:
    """Return how many journal events the first ``upto`` lines hold (counted by sequence)."""
    import orjson

    count = 0
    for line in lines[:upto]:
        record = orjson.loads(line[20:-2])
        if record.get("k") == "events":
            count = record["seq"] + len(record["events"]) - 1
    return count


Fsck = Callable[[StoreSpec], Awaitable[bool]]
"""Return True when a checker reports damage in the given store."""


async def check_mutation(
    stats: KindStats,
    spec: StoreSpec,
    path: Path,
    original: bytes,
    events: list[JournalEvent],
    mutation: Mutation,
    fsck: Fsck | None = None,
) -> None:
    """Damage the journal at ``path`` by ``mutation`` and check the rules; count in ``stats``."""
    lines = split_lines(original)
    damaged = mutation.apply(lines)
    file = anyio.Path(path)
    await file.write_bytes(damaged)
    first_bad = damaged_line(lines, damaged)
    keep = events_in_lines(events, lines, first_bad)
    stats.trials += 1
    stats.faults += 1
    stats.acked += keep
    where = f"{stats.kind}: {mutation}"
    read: list[JournalEvent] | None = None
    title: str | None = "title 5"
    store = await spec.factory().open()
    try:
        try:
            read = await store.read_events(THREAD_ID)
            title = (await store.get_thread(THREAD_ID)).title
            await store.replay_events(THREAD_ID)
        except RoderError:
            read = None
        except Exception as exc:  # noqa: BLE001 - anything else is the finding
            stats.problem(f"{where}: reading raised {type(exc).__name__}: {exc}", corrupt=1)
            return
        if read is not None:
            if read[:keep] != events[:keep]:
                stats.problem(f"{where}: records before the damage were lost", lost=1)
            if read != events[: len(read)]:
                stats.problem(f"{where}: read back events that were never written", corrupt=1)
        before = await file.read_bytes()
        try:
            appended = await store.append_events(
                THREAD_ID, [ItemCompleted("after", UserMessage("after the damage"))]
            )
        except RoderError:
            if await file.read_bytes() != before:
                stats.problem(f"{where}: a refused write changed the file", corrupt=1)
        except Exception as exc:  # noqa: BLE001 - anything else is the finding
            stats.problem(f"{where}: writing raised {type(exc).__name__}: {exc}", corrupt=1)
        else:
            after = await store.read_events(THREAD_ID)
            if after[:keep] != events[:keep]:
                stats.problem(f"{where}: a write after the damage lost records", lost=1)
            if after[-1].sequence != appended[0].sequence or after[-1].sequence != len(after):
                stats.problem(f"{where}: the write after the damage is misplaced", corrupt=1)
    finally:
        await store.aclose()
    changed = read != events or title != "title 5"
    clean_truncation = mutation.kind == "truncate" and damaged == b"".join(lines[:first_bad])
    if fsck is not None and changed and not clean_truncation:
        await file.write_bytes(damaged)
        if await fsck(spec):
            stats.notes["fsck reported"] = stats.notes.get("fsck reported", 0) + 1
            await _check_repair(stats, spec, events[:keep], where)
        else:
            stats.problem(f"{where}: fsck did not report the damage", corrupt=1)


async def _check_repair(
    stats: KindStats, spec: StoreSpec, kept: list[JournalEvent], where: str
) -> None:
    """Repair (when the store can) and check every record before the damage survived."""
    store = await spec.factory().open()
    try:
        repair = getattr(store, "repair_thread", None)
        if repair is None:
            return
        try:
            await repair(THREAD_ID)
            read = await store.read_events(THREAD_ID)
        except RoderError as exc:
            if kept:
                stats.problem(f"{where}: after repair the thread is unreadable: {exc}", lost=1)
            return
        if read[: len(kept)] != kept:
            stats.problem(f"{where}: the repair lost records before the damage", lost=1)
        stats.notes["repaired"] = stats.notes.get("repaired", 0) + 1
    finally:
        await store.aclose()


async def run_hostile(
    spec_for: Callable[[Path], StoreSpec],
    workdir: Path,
    trials: int,
    *,
    seed: int = 0,
    fsck: Fsck | None = None,
) -> KindStats:
    """Run ``trials`` random damages of a freshly built journal; return the counts."""
    rng = random.Random(seed)
    stats = KindStats(f"hostile journals / {spec_for(workdir).name}")
    template = workdir / "template"
    shutil.rmtree(template, ignore_errors=True)
    path, events = await build_journal(spec_for(template))
    original = path.read_bytes()
    for number in range(trials):
        base = workdir / f"m{number}"
        shutil.copytree(template, base)
        spec = spec_for(base)
        target = base / path.relative_to(template)
        started = time.perf_counter()
        await check_mutation(stats, spec, target, original, events, random_mutation(rng), fsck)
        stats.recovery_ms.append((time.perf_counter() - started) * 1000)
        shutil.rmtree(base, ignore_errors=True)
    return stats


def fsck_available() -> bool:
    """Return True when this Roder has the ``roder fsck`` command."""
    from roder_runtime import cli

    modules = getattr(cli, "COMMAND_MODULES", ())
    return any(getattr(m, "__name__", "").endswith("fsck") for m in modules)


async def store_fsck(spec: StoreSpec) -> bool:
    """Return True when the store's own check (what ``roder fsck`` runs) reports damage."""
    store = await spec.factory().open()
    try:
        check = await store.check_thread(THREAD_ID)  # type: ignore[attr-defined]
        return not check.ok
    except RoderError:
        return True  # refusing to check the thread at all is reporting it
    finally:
        await store.aclose()


async def cli_fsck(spec: StoreSpec) -> bool:
    """Run ``roder fsck`` on the JSONL store of ``spec``; return True when it reports damage.

    Exit status 0 means a clean store; anything else (damage found) counts as reported.
    """
    import os
    import sys

    base = Path(str(spec.settings["path"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(base / "home")
    env["RODER_THREADS_PATH"] = str(base)
    env["RODER_THREAD_STORE"] = "jsonl"
    done = await anyio.run_process(
        [sys.executable, "-m", "roder_runtime", "fsck"], env=env, check=False
    )
    return done.returncode != 0
