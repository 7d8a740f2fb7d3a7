"""Reordered and truncated journals: damage that keeps every line intact.

Lines of a JSONL journal swapped or one written over another at equal length (the file's
size unchanged, every checksum good), or the journal cut cleanly at a line boundary: what a
user editing the file, a bad restore or a misbehaving copy leaves. The thread's journal is
built through the store, so its index row knows the real last sequence. For every damage:

- every read (``read_events``, ``read_snapshot``, ``replay_events``, a read from the middle)
  raises ``StoreCorruptedError``: nothing is returned reordered, repeated or short;
- a store that read the thread (as a resuming session does) refuses the next append and
  leaves the file as it was; a store that appends without reading either refuses or writes
  the next sequence never used (no sequence number is written twice);
- the store's own check (what ``roder fsck`` runs) reports the journal damaged.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from roder_api.errors import RoderError, StoreCorruptedError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage

from .stats import KindStats
from .stores import StoreSpec

THREAD_ID = "reordered-thread"
EVENTS = 9
"""Events lines in the built journal, one event each and all of one length (seq 1-9)."""


@dataclass(frozen=True)
class Reorder:
    """One damage: ``swap`` lines a and b, ``overwrite`` line b with line a, ``cut`` at a."""

    kind: str
    a: int
    b: int = 0

    def apply(self, lines: list[bytes]) -> bytes:
        """Return the journal ``lines`` (the create line first) damaged by this."""
        damaged = list(lines)
        if self.kind == "swap":
            damaged[self.a], damaged[self.b] = damaged[self.b], damaged[self.a]
        elif self.kind == "overwrite":
            damaged[self.b] = damaged[self.a]
        elif self.kind == "cut":
            damaged = damaged[: self.a]
        else:
            raise ValueError(f"unknown damage {self.kind!r}")
        return b"".join(damaged)


def random_reorder(rng: random.Random, events_lines: int) -> Reorder:
    """Return a random damage of a journal of one create line and ``events_lines`` lines."""
    kind = rng.choice(("swap", "overwrite", "cut"))
    if kind == "cut":
        return Reorder(kind, rng.randrange(1, events_lines + 1))  # keep the create line
    a, b = rng.sample(range(1, events_lines + 1), 2)
    return Reorder(kind, min(a, b), max(a, b)) if kind == "swap" else Reorder(kind, a, b)


async def build_journal(spec: StoreSpec) -> Path:
    """Create a thread of EVENTS equal-length lines through the store; return its file."""
    store = await spec.factory().open()
    try:
        now = int(time.time() * 1000)
        await store.create_thread(ThreadMetadata(THREAD_ID, now, now))
        for number in range(EVENTS):
            item = ItemCompleted("turn", UserMessage(f"message {number:04d}"))
            await store.append_events(THREAD_ID, [item])
        path = Path(getattr(store, "journal_path")(THREAD_ID))  # noqa: B009 - JSONL only
    finally:
        await store.aclose()
    return path


async def check_reorder(stats: KindStats, spec: StoreSpec, path: Path, damage: Reorder) -> None:
    """Damage the journal at ``path`` and check the rules of the module doc."""
    file = anyio.Path(path)
    lines = (await file.read_bytes()).splitlines(keepends=True)
    damaged = damage.apply(lines)
    if damage.kind != "cut" and len(damaged) != sum(map(len, lines)):
        stats.problem(f"{stats.kind}: {damage}: the built lines differ in length", corrupt=1)
        return
    await file.write_bytes(damaged)
    stats.trials += 1
    stats.faults += 1
    stats.acked += EVENTS
    where = f"{stats.kind}: {damage}"

    async def reads_refused(store: object) -> bool:
        for name, kwargs in (
            ("read_events", {}),
            ("read_snapshot", {}),
            ("replay_events", {}),
            ("read_events", {"after": EVENTS // 2}),
        ):
            try:
                got = await getattr(store, name)(THREAD_ID, **kwargs)
            except StoreCorruptedError:
                continue
            except Exception as exc:  # noqa: BLE001 - anything else is the finding
                stats.problem(f"{where}: {name} raised {type(exc).__name__}: {exc}", corrupt=1)
                return False
            # The one read that may answer: after the damage's end, the tail is intact.
            if name == "read_events" and kwargs and _tail_intact(damage, EVENTS // 2):
                if [e.sequence for e in got] != list(range(EVENTS // 2 + 1, EVENTS + 1)):
                    stats.problem(f"{where}: {name}{kwargs} read a wrong tail", corrupt=1)
                continue
            stats.problem(f"{where}: {name}{kwargs} returned the damaged journal", corrupt=1)
            return False
        return True

    # A store that reads first, as a resuming session does: reads and the append refuse.
    store = await spec.factory().open()
    try:
        if await reads_refused(store):
            try:
                await store.append_events(THREAD_ID, [ItemCompleted("t", UserMessage("after"))])
                stats.problem(f"{where}: an append after a refused read was written", corrupt=1)
            except RoderError:
                if await file.read_bytes() != damaged:
                    stats.problem(f"{where}: a refused append changed the file", corrupt=1)
    finally:
        await store.aclose()

    # A fresh store that appends first: refused, or the next sequence never used.
    store = await spec.factory().open()
    try:
        try:
            appended = await store.append_events(
                THREAD_ID, [ItemCompleted("t", UserMessage("after"))]
            )
        except RoderError:
            if await file.read_bytes() != damaged:
                stats.problem(f"{where}: a refused append changed the file", corrupt=1)
        else:
            if appended[0].sequence != EVENTS + 1:
                stats.problem(
                    f"{where}: an append wrote sequence {appended[0].sequence} again", corrupt=1
                )
            stats.notes["appends past middle damage"] = (
                stats.notes.get("appends past middle damage", 0) + 1
            )
            if not await reads_refused(store):
                return
        check = await store.check_thread(THREAD_ID)  # type: ignore[attr-defined]
        if not check.data_damaged:
            stats.problem(f"{where}: fsck did not report the damage: {check.describe()}", corrupt=1)
    finally:
        await store.aclose()


def _tail_intact(damage: Reorder, after: int) -> bool:
    """Return True when the lines holding sequences above ``after`` are untouched.

    Line ``n`` holds sequence ``n`` (line 0 is the create line). A swap touches lines a and
    b; an overwrite changes only line b (line a is read, not written); a cut loses the end.
    """
    if damage.kind == "cut":
        return False
    return max(damage.a, damage.b) <= after if damage.kind == "swap" else damage.b <= after


async def run_reordered(
    spec_for: Callable[[Path], StoreSpec], workdir: Path, trials: int, *, seed: int = 0
) -> KindStats:
    """Run ``trials`` random reorderings and cuts of a freshly built journal; return counts."""
    rng = random.Random(seed)
    stats = KindStats(f"reordered journals / {spec_for(workdir).name}")
    template = workdir / "template"
    shutil.rmtree(template, ignore_errors=True)
    path = await build_journal(spec_for(template))
    for number in range(trials):
        base = workdir / f"r{number}"
        shutil.copytree(template, base)
        target = base / path.relative_to(template)
        started = time.perf_counter()
        await check_reorder(stats, spec_for(base), target, random_reorder(rng, EVENTS))
        stats.recovery_ms.append((time.perf_counter() - started) * 1000)
        shutil.rmtree(base, ignore_errors=True)
    return stats
