"""Checking and repairing a JSONL store (``roder fsck``): reports, repair, reindex.

Checking reads every line of a journal and compares the index row with what it finds; it
changes nothing and works on a store nobody may write. Repairing never deletes data: the
damaged part of a journal (from its first bad line to the end) is copied to
``<journal>.quarantine-<ms>`` and synced before the journal is cut there; a journal without
a valid first line is renamed to its quarantine name as a whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from roder_api.codec import from_dict, loads_json
from roder_api.errors import ThreadNotFoundError
from roder_api.storekit import CheckReport, RepairReport
from roder_jsonl_thread_store._core import StoreCore, log, quarantine_path, quarantine_tail
from roder_jsonl_thread_store._index import IndexRow, IndexUnavailable
from roder_jsonl_thread_store._journal import (
    NEWER_VERSION,
    TORN_TAIL,
    Damage,
    JournalState,
    lost_lines,
    scan,
)
from roder_jsonl_thread_store._locks import ProcessLock
from roder_jsonl_thread_store._reader import JournalReader
from roder_jsonl_thread_store._writer import JournalWriter


@dataclass(frozen=True, slots=True)
class ThreadCheck(CheckReport):
    """What checking one journal found.

    ``damage`` is the first problem in the journal (None: every line is good);
    ``index`` says whether the listing index agrees: ``ok``, ``missing``, ``behind`` or
    ``disagrees``.
    """

    thread_id: str
    path: Path
    size: int
    lines: int
    last_sequence: int
    damage: Damage | None
    index: str

    @property
    def ok(self) -> bool:
        """Return True when the journal is intact and the index agrees with it."""
        return self.damage is None and self.index == "ok"

    @property
    def data_damaged(self) -> bool:
        """Return True when the journal itself is damaged (not only its index row)."""
        return self.damage is not None

    def describe(self) -> str:
        """Return one line saying what is wrong (or ``ok``)."""
        parts = []
        if self.damage is not None:
            parts.append(
                f"line {self.damage.line} (byte {self.damage.offset}): {self.damage.kind}: "
                f"{self.damage.reason}"
            )
        if self.index != "ok":
            parts.append(f"index {self.index}")
        return "; ".join(parts) or "ok"

    def to_json(self) -> dict[str, Any]:
        """Return the check as plain JSON data."""
        damage = None
        if self.damage is not None:
            damage = {
                "line": self.damage.line,
                "offset": self.damage.offset,
                "kind": self.damage.kind,
                "reason": self.damage.reason,
            }
        return {
            "thread_id": self.thread_id,
            "path": str(self.path),
            "size": self.size,
            "lines": self.lines,
            "last_sequence": self.last_sequence,
            "damage": damage,
            "index": self.index,
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True)
class ThreadRepair(RepairReport):
    """What repairing one journal did.

    ``quarantine`` is the file the damaged tail was moved to (None: nothing moved);
    ``unrepaired`` says why damage was left in place (a newer format version).
    ``newline_added`` is kept for compatibility and always False: an unterminated last
    line is a torn write, moved to the quarantine file like any torn tail.
    """

    thread_id: str
    quarantine: Path | None = None
    bytes_moved: int = 0
    newline_added: bool = False
    journal_removed: bool = False
    index_fixed: bool = False
    unrepaired: str | None = None

    @property
    def changed(self) -> bool:
        """Return True when the repair changed the journal or the index."""
        return bool(self.quarantine or self.newline_added or self.index_fixed)

    @property
    def unrepaired_reason(self) -> str | None:
        """Return why damage was left in place (None: repaired)."""
        return self.unrepaired

    @property
    def thread_removed(self) -> bool:
        """Return True when the whole journal was moved to quarantine."""
        return self.journal_removed

    def to_json(self) -> dict[str, Any]:
        """Return the repair as plain JSON data."""
        return {
            "thread_id": self.thread_id,
            "quarantine": str(self.quarantine) if self.quarantine else None,
            "bytes_moved": self.bytes_moved,
            "newline_added": self.newline_added,
            "journal_removed": self.journal_removed,
            "index_fixed": self.index_fixed,
            "unrepaired": self.unrepaired,
        }


def truncation(state: JournalState, row: IndexRow) -> Damage | None:
    """Return the damage of a journal that lost lines its index row knows, else None."""
    last = from_dict(loads_json(row.meta)).last_sequence
    return lost_lines(state, row.lines, row.head_crc, last)


class JournalChecker:
    """fsck for one store: check (read only), repair, reindex, prune."""

    def __init__(self, core: StoreCore, reader: JournalReader, writer: JournalWriter) -> None:
        self.core = core
        self.reader = reader
        self.writer = writer

    def journal_ids(self) -> list[str]:
        """Return the id of every journal on disk, sorted."""
        self.reader.ensure_ready()
        return sorted(self.core.journal_files())

    def check(self, thread_id: str) -> ThreadCheck:
        """Return what a full check of a thread's journal and index row finds (no changes)."""
        core = self.core
        self.reader.ensure_ready()
        path = core.journal_path(thread_id)
        with core.guard(thread_id):
            # Wait out a writer mid-write (it would look like a torn tail); take nothing else.
            lock = ProcessLock.wait_for_writer(core.lock_path(thread_id))
            try:
                try:
                    file = open(path, "rb")
                except FileNotFoundError:
                    raise ThreadNotFoundError(thread_id) from None
                with file:
                    st = os.fstat(file.fileno())
                    result = scan(file, st.st_ino, None, thread_id=thread_id, full_check=True)
                try:
                    row = core.index.get(thread_id)
                except IndexUnavailable:
                    row = None
            finally:
                if lock is not None:
                    os.close(lock)
        state = result.state
        if row is None:
            index = "missing"
        elif state is None:
            index = "disagrees"
        elif replace(core.row(thread_id, state), inode=row.inode) == row:
            # Inode numbers alone do not make a row wrong: a store copied or restored
            # (`cp -a`, a backup) has the same bytes under new numbers. Readers refresh it.
            index = "ok"
        elif row.size < state.size and truncation(state, row) is None:
            index = "behind"
        else:
            index = "disagrees"
        if state is not None and row is not None and result.damage is None:
            result = replace(result, damage=truncation(state, row))
        if state is None and result.damage is None:
            result = replace(result, damage=Damage(0, 1, "header", "the journal is empty"))
        return ThreadCheck(
            thread_id=thread_id,
            path=path,
            size=result.file_size,
            lines=state.lines if state else 0,
            last_sequence=state.metadata.last_sequence if state else 0,
            damage=result.damage,
            index=index,
        )

    def repair(self, thread_id: str) -> ThreadRepair:
        """Move a damaged tail to a quarantine file and fix the thread's index row."""
        core = self.core
        self.reader.ensure_ready()
        core.start_session()
        path = core.journal_path(thread_id)
        with core.guard(thread_id), ProcessLock(core.lock_path(thread_id)):
            try:
                file = open(path, "rb")
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            with file:
                st = os.fstat(file.fileno())
                result = scan(file, st.st_ino, None, thread_id=thread_id)
            core.states.pop(thread_id, None)
            core.damaged.pop(thread_id, None)
            damage = result.damage
            repair = ThreadRepair(thread_id)
            if damage is not None and damage.kind == NEWER_VERSION:
                return replace(
                    repair,
                    unrepaired=f"line {damage.line} is from a newer Roder; upgrade roder",
                )
            try:
                row = core.index.get(thread_id)
            except IndexUnavailable:
                row = None
            lost = None
            if result.state is not None and row is not None:
                lost = truncation(result.state, row)
            if lost is not None:
                # The row knows lines the journal no longer has (or will not keep after the
                # cut below). Repairing accepts the shorter journal, as --reindex does: its
                # lost sequence numbers are written again from here on, so say so. Until a
                # repair every read and write refuses.
                if damage is None or damage.automatic:
                    log.warning("journal %s: %s; accepting the shorter journal", path, lost.reason)
                core.delete_row(thread_id)
            if damage is not None:
                quarantine = quarantine_path(path)
                if result.state is None or damage.offset == 0:
                    os.rename(path, quarantine)
                    core.sync_dir(core.threads_dir)
                    core.delete_row(thread_id)
                    log.warning("journal %s: moved to %s (no valid first line)", path, quarantine)
                    return replace(
                        repair,
                        quarantine=quarantine,
                        bytes_moved=result.file_size,
                        journal_removed=True,
                        index_fixed=True,
                    )
                moved = quarantine_tail(path, quarantine, damage.offset)
                what = "a torn last line" if damage.kind == TORN_TAIL else "damaged bytes"
                log.warning(
                    "journal %s: moved %s (%d bytes from line %d) to %s",
                    path,
                    what,
                    moved,
                    damage.line,
                    quarantine,
                )
                repair = replace(repair, quarantine=quarantine, bytes_moved=moved)
            try:
                before = core.index.get(thread_id)
            except IndexUnavailable:
                before = None
            state = self.writer.locked_state(thread_id)
            row = core.row(thread_id, state)
            core.put_rows([row])
            if before != row:
                repair = replace(repair, index_fixed=True)
            return repair

    def reindex_thread(self, thread_id: str) -> bool:
        """Rebuild one index row from a full scan; return True when the thread is indexed."""
        core = self.core
        self.reader.ensure_ready()
        core.start_session()
        with core.guard(thread_id), ProcessLock(core.lock_path(thread_id)):
            core.states.pop(thread_id, None)
            core.damaged.pop(thread_id, None)
            try:
                file = open(core.journal_path(thread_id), "rb")
            except FileNotFoundError:
                core.delete_row(thread_id)
                return False
            with file:
                st = os.fstat(file.fileno())
                result = scan(file, st.st_ino, None, thread_id=thread_id)
            state = result.state
            if state is not None and (result.damage is None or result.damage.automatic):
                # A torn tail stays for the next write (or a repair) to move; index the rest.
                core.put_rows([core.row(thread_id, state)])
                core.states[thread_id] = state
                return True
            # A damaged journal keeps no row: listing it would promise what loading refuses.
            core.delete_row(thread_id)
            return False

    def prune_index(self) -> int:
        """Remove the rows of journals that no longer exist; return how many."""
        core = self.core
        self.reader.ensure_ready()
        removed = 0
        for thread_id in set(core.index.sizes()) - set(core.journal_files()):
            with core.guard(thread_id), ProcessLock(core.lock_path(thread_id)):
                if not core.journal_path(thread_id).exists():
                    core.delete_row(thread_id)
                    removed += 1
        return removed
