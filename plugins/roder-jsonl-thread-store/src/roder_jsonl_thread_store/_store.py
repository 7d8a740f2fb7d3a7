"""The JSONL thread store: one append-only, checksummed journal file per thread."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import orjson
from filelock import FileLock

from roder_api._record import to_dict
from roder_api.codec import from_dict
from roder_api.errors import (
    SequenceConflictError,
    StoppedError,
    StoreCorruptedError,
    StoreError,
    ThreadExistsError,
    ThreadNotFoundError,
    UnserializableEventError,
)
from roder_api.events import Event, JournalEvent
from roder_api.inference import TokenUsage
from roder_api.threads import (
    UNSET,
    ThreadMetadata,
    ThreadPage,
    ThreadStore,
    ThreadStoreFactory,
    decode_cursor,
    encode_cursor,
    listing_key,
    validate_thread_id,
)
from roder_api.transcript import is_compaction_boundary
from roder_jsonl_thread_store._format import (
    FORMAT_VERSION,
    encode_record,
    events_record,
    scan,
)

log = logging.getLogger("roder.jsonl")

DURABILITY_MODES = ("fsync", "group", "none")
"""``fsync``: each commit synced before it returns; ``group``: concurrent commits share one
sync, each still durable before it returns; ``none``: handed to the OS only."""

JOURNAL_SUFFIX = ".jsonl"

T = TypeVar("T")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


@dataclass(slots=True)
class _State:
    """What this process knows of one journal, up to ``size`` bytes."""

    inode: int
    size: int
    lines: int
    metadata: ThreadMetadata
    boundary_offset: int
    boundary_sequence: int


def _raw_is_boundary(event: Mapping[str, Any]) -> bool:
    if event.get("type") != "item_completed":
        return False
    item = event.get("item")
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    if kind == "context_compaction":
        return True
    if kind != "provider_metadata":
        return False
    try:
        return is_compaction_boundary(from_dict(item))
    except ValueError:
        return False


class JsonlThreadStore(ThreadStore):
    """A thread store of one ``<thread id>.jsonl`` journal per thread under ``base_path``.

    Each committed batch is one line written with one ``write`` and synced per the
    durability mode. Writers to one thread are serialised in this process (a lock per
    thread) and across processes (``filelock``, released by the OS when a process dies).
    A torn last line is cut away by the next writer; damage followed by valid lines is
    refused with ``StoreCorruptedError``.
    """

    def __init__(self, base_path: Path, *, durability: str = "fsync") -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = base_path
        self.durability = durability
        self.threads_dir = base_path / "threads"
        self.locks_dir = base_path / "locks"
        self.tmp_dir = base_path / "tmp"
        self._states: dict[str, _State] = {}
        self._guards: dict[str, threading.Lock] = {}
        self._guards_lock = threading.Lock()
        self._closed = False

    # --- helpers --------------------------------------------------------------------------

    def journal_path(self, thread_id: str) -> Path:
        """Return the journal file of a thread (validating the id)."""
        return self.threads_dir / (validate_thread_id(thread_id) + JOURNAL_SUFFIX)

    def _lock_path(self, thread_id: str) -> Path:
        return self.locks_dir / (thread_id + ".lock")

    def _guard(self, thread_id: str) -> threading.Lock:
        with self._guards_lock:
            guard = self._guards.get(thread_id)
            if guard is None:
                guard = self._guards[thread_id] = threading.Lock()
            return guard

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoppedError("the JSONL thread store is closed; open a new one")
        return await anyio.to_thread.run_sync(func, *args)

    def _sync(self, fd: int) -> None:
        if self.durability != "none":
            _datasync(fd)

    # --- scanning -------------------------------------------------------------------------

    def _refresh(self, thread_id: str, *, repair: bool) -> _State:
        """Return the thread's state, scanning what was appended since the last look.

        Call with the thread's guard held; with ``repair`` also hold the file lock.
        """
        path = self.journal_path(thread_id)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._states.pop(thread_id, None)
            raise ThreadNotFoundError(thread_id) from None
        state = self._states.get(thread_id)
        if state is not None and state.inode == st.st_ino and st.st_size == state.size:
            return state
        if state is None or state.inode != st.st_ino or st.st_size < state.size:
            state = None
        with open(path, "rb") as file:
            state = self._scan_into(thread_id, path, file, state, st.st_ino, repair=repair)
        self._states[thread_id] = state
        return state

    def _scan_into(
        self,
        thread_id: str,
        path: Path,
        file: Any,
        state: _State | None,
        inode: int,
        *,
        repair: bool,
    ) -> _State:
        offset = state.size if state is not None else 0
        line_no = state.lines + 1 if state is not None else 1
        metadata = state.metadata if state is not None else None
        boundary_offset = state.boundary_offset if state is not None else 0
        boundary_sequence = state.boundary_sequence if state is not None else 0
        good_end = offset
        good_lines = line_no - 1
        bad: tuple[int, int, str] | None = None  # (offset, line, error) of the first bad line
        unterminated_valid = False
        usage = metadata.usage if metadata else TokenUsage()
        items = metadata.item_count if metadata else 0
        last_seq = metadata.last_sequence if metadata else 0
        updated = metadata.updated_at_ms if metadata else 0
        title = metadata.title if metadata else None
        extra: Mapping[str, Any] = metadata.extra if metadata else {}
        created = metadata.created_at_ms if metadata else 0
        for line in scan(file, offset, line_no):
            if line.record is None or not line.terminated:
                if bad is None:
                    reason = line.error or "unterminated line"
                    if line.record is not None:
                        reason = "unterminated line"
                    bad = (line.offset, line.number, reason)
                    unterminated_valid = line.record is not None
                continue
            if bad is not None:
                raise StoreCorruptedError(
                    f"journal {path} is damaged at line {bad[1]} ({bad[2]}) with valid records "
                    f"after it; run `roder fsck --repair` to quarantine the damage",
                    thread_id=thread_id,
                    path=str(path),
                    line=bad[1],
                )
            record = line.record
            version = record.get("v")
            if not isinstance(version, int) or version > FORMAT_VERSION:
                raise StoreError(
                    f"journal {path} line {line.number} was written in format version "
                    f"{version!r} by a newer Roder (this one reads up to {FORMAT_VERSION}); "
                    "upgrade roder to read it"
                )
            kind = record.get("k")
            if metadata is None:
                if kind != "create":
                    raise StoreCorruptedError(
                        f"journal {path} does not start with a create record",
                        thread_id=thread_id,
                        path=str(path),
                        line=line.number,
                    )
                base = from_dict(record["meta"])
                metadata = base
                created, updated = base.created_at_ms, base.updated_at_ms
                title, extra = base.title, base.extra
            elif kind == "events":
                seq = record["seq"]
                if seq != last_seq + 1:
                    raise StoreCorruptedError(
                        f"journal {path} line {line.number}: sequence {seq} follows {last_seq}",
                        thread_id=thread_id,
                        path=str(path),
                        line=line.number,
                    )
                for index, event in enumerate(record["events"]):
                    etype = event.get("type")
                    if etype == "usage_updated":
                        usage = usage + from_dict(event["usage"])
                    elif etype == "item_completed":
                        items += 1
                        if _raw_is_boundary(event):
                            boundary_offset = line.offset
                            boundary_sequence = seq + index
                last_seq = seq + len(record["events"]) - 1
                updated = max(updated, record["t"])
            elif kind == "meta":
                if "title" in record:
                    title = record["title"]
                if "extra" in record:
                    extra = record["extra"]
                updated = max(updated, record["t"])
            good_end = line.end
            good_lines = line.number
        if metadata is None:
            raise ThreadNotFoundError(thread_id)
        if bad is not None and repair:
            size = os.path.getsize(path)
            if unterminated_valid:
                # A complete record that only lacks its newline: keep it.
                with open(path, "ab") as out:
                    out.write(b"\n")
                    out.flush()
                    self._sync(out.fileno())
                log.warning("journal %s: added the missing newline of the last line", path)
                return self._scan_into(thread_id, path, file, state, inode, repair=repair)
            os.truncate(path, good_end)
            with open(path, "rb+") as out:
                self._sync(out.fileno())
            log.warning(
                "journal %s: cut a torn last line (%d bytes removed)", path, size - good_end
            )
        return _State(
            inode=inode,
            size=good_end,
            lines=good_lines,
            metadata=replace(
                metadata,
                title=title,
                extra=extra,
                created_at_ms=created,
                updated_at_ms=updated,
                usage=usage,
                item_count=items,
                last_sequence=last_seq,
            ),
            boundary_offset=boundary_offset,
            boundary_sequence=boundary_sequence,
        )

    # --- writing --------------------------------------------------------------------------

    def _locked_append(
        self, thread_id: str, build: Callable[[_State], bytes]
    ) -> tuple[_State, bytes]:
        """Append the line ``build(state)`` returns, under both locks; return the old state."""
        path = self.journal_path(thread_id)
        with self._guard(thread_id), FileLock(self._lock_path(thread_id)):
            state = self._refresh(thread_id, repair=True)
            line = build(state)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                try:
                    written = os.write(fd, line)
                    while written < len(line):
                        written += os.write(fd, line[written:])
                    self._sync(fd)
                except OSError as exc:
                    # Leave no partial record behind; the next writer would cut it anyway.
                    try:
                        os.ftruncate(fd, state.size)
                    except OSError:
                        pass
                    self._states.pop(thread_id, None)
                    raise StoreError(
                        f"could not append to {path}: {exc.strerror or exc}; nothing of this "
                        "batch was stored"
                        + ("; free disk space and retry" if exc.errno == errno.ENOSPC else "")
                    ) from exc
            finally:
                os.close(fd)
            return state, line

    def _append_events_sync(
        self, thread_id: str, events_json: bytes, events: Sequence[Event]
    ) -> list[JournalEvent]:
        result: list[JournalEvent] = []

        def build(state: _State) -> bytes:
            first = state.metadata.last_sequence + 1
            now = int(time.time() * 1000)
            result.extend(JournalEvent(first + i, now, e) for i, e in enumerate(events))
            return events_record(first, now, events_json)

        self._locked_append(thread_id, build)
        return result

    def _import_sync(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        def build(state: _State) -> bytes:
            expected = state.metadata.last_sequence + 1
            if entries[0].sequence != expected:
                raise SequenceConflictError(thread_id, expected, entries[0].sequence)
            lines = []
            for entry in entries:
                events_json = orjson.dumps([to_dict(entry.event)])
                lines.append(events_record(entry.sequence, entry.recorded_at_ms, events_json))
            return b"".join(lines)

        self._locked_append(thread_id, build)

    def _create_sync(self, metadata: ThreadMetadata) -> ThreadMetadata:
        thread_id = metadata.thread_id
        path = self.journal_path(thread_id)
        stored = replace(metadata, usage=TokenUsage(), item_count=0, last_sequence=0)
        line = encode_record({"v": FORMAT_VERSION, "k": "create", "meta": to_dict(stored)})
        with self._guard(thread_id), FileLock(self._lock_path(thread_id)):
            if path.exists():
                raise ThreadExistsError(thread_id)
            tmp = self.tmp_dir / f"{thread_id}.{os.getpid()}.{threading.get_ident()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, line)
                self._sync(fd)
            finally:
                os.close(fd)
            try:
                # link() is atomic and refuses to replace: a journal always has its header.
                os.link(tmp, path)
            except FileExistsError:
                raise ThreadExistsError(thread_id) from None
            finally:
                os.unlink(tmp)
            if self.durability != "none":
                _fsync_dir(self.threads_dir)
            self._states.pop(thread_id, None)
            return self._refresh(thread_id, repair=False).metadata

    def _update_sync(self, thread_id: str, changes: dict[str, Any]) -> ThreadMetadata:
        def build(state: _State) -> bytes:
            record = {"v": FORMAT_VERSION, "k": "meta", "t": int(time.time() * 1000), **changes}
            return encode_record(record)

        self._locked_append(thread_id, build)
        with self._guard(thread_id):
            return self._refresh(thread_id, repair=False).metadata

    def _delete_sync(self, thread_id: str) -> None:
        path = self.journal_path(thread_id)
        with self._guard(thread_id), FileLock(self._lock_path(thread_id)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None
            finally:
                self._states.pop(thread_id, None)
            if self.durability != "none":
                _fsync_dir(self.threads_dir)

    # --- reading --------------------------------------------------------------------------

    def _metadata_sync(self, thread_id: str) -> ThreadMetadata:
        with self._guard(thread_id):
            return self._refresh(thread_id, repair=False).metadata

    def _read_sync(
        self, thread_id: str, after: int, limit: int | None, replay: bool
    ) -> list[JournalEvent]:
        with self._guard(thread_id):
            state = self._refresh(thread_id, repair=False)
        path = self.journal_path(thread_id)
        offset = 0
        if replay:
            offset = state.boundary_offset
            after = max(after, state.boundary_sequence - 1)
        out: list[JournalEvent] = []
        try:
            file = open(path, "rb")
        except FileNotFoundError:
            raise ThreadNotFoundError(thread_id) from None
        with file:
            file.seek(offset)
            position = offset
            for raw in file:
                position += len(raw)
                if position > state.size:
                    break
                record = orjson.loads(raw[20:-2])
                if record["k"] != "events":
                    continue
                seq = record["seq"]
                events = record["events"]
                if seq + len(events) - 1 <= after:
                    continue
                t = record["t"]
                for index, event in enumerate(events):
                    sequence = seq + index
                    if sequence > after:
                        out.append(JournalEvent(sequence, t, from_dict(event)))
                        if limit is not None and len(out) >= limit:
                            return out
        return out

    def _list_sync(self, cursor: str | None, limit: int) -> ThreadPage:
        position = decode_cursor(cursor) if cursor else None
        metas: list[ThreadMetadata] = []
        try:
            entries = list(os.scandir(self.threads_dir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not entry.name.endswith(JOURNAL_SUFFIX):
                continue
            thread_id = entry.name[: -len(JOURNAL_SUFFIX)]
            try:
                with self._guard(thread_id):
                    metas.append(self._refresh(thread_id, repair=False).metadata)
            except ThreadNotFoundError:
                continue
        metas.sort(key=listing_key, reverse=True)
        if position is not None:
            metas = [m for m in metas if listing_key(m) < position]
        page = metas[:limit]
        more = len(metas) > limit
        next_cursor = encode_cursor(*listing_key(page[-1])) if more and page else None
        return ThreadPage(tuple(page), next_cursor)

    # --- the ThreadStore API --------------------------------------------------------------

    async def create_thread(self, metadata: ThreadMetadata) -> ThreadMetadata:
        """Create a thread's journal (atomically, with its metadata as the first line)."""
        validate_thread_id(metadata.thread_id)
        return await self._run(self._create_sync, metadata)

    async def get_thread(self, thread_id: str) -> ThreadMetadata:
        """Return a thread's metadata."""
        validate_thread_id(thread_id)
        return await self._run(self._metadata_sync, thread_id)

    async def update_thread(
        self,
        thread_id: str,
        *,
        title: str | None = UNSET,
        extra: Mapping[str, Any] = UNSET,
    ) -> ThreadMetadata:
        """Change a thread's title and/or extra metadata."""
        validate_thread_id(thread_id)
        changes: dict[str, Any] = {}
        if title is not UNSET:
            changes["title"] = title
        if extra is not UNSET:
            changes["extra"] = dict(extra)
        if not changes:
            return await self.get_thread(thread_id)
        return await self._run(self._update_sync, thread_id, changes)

    async def append_events(self, thread_id: str, events: Sequence[Event]) -> list[JournalEvent]:
        """Append ``events`` as one atomic, durable line."""
        validate_thread_id(thread_id)
        if not events:
            return []
        try:
            events_json = orjson.dumps([to_dict(e) for e in events])
        except (TypeError, AttributeError) as exc:
            raise UnserializableEventError(
                f"cannot serialise an event of this batch: {exc}; nothing was stored"
            ) from exc
        return await self._run(self._append_events_sync, thread_id, events_json, list(events))

    async def import_events(self, thread_id: str, entries: Sequence[JournalEvent]) -> None:
        """Append journal events verbatim."""
        validate_thread_id(thread_id)
        if not entries:
            return
        for previous, entry in zip(entries, entries[1:], strict=False):
            if entry.sequence != previous.sequence + 1:
                raise SequenceConflictError(thread_id, previous.sequence + 1, entry.sequence)
        await self._run(self._import_sync, thread_id, list(entries))

    async def read_events(
        self, thread_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[JournalEvent]:
        """Return the events with sequence above ``after``, streaming the journal."""
        validate_thread_id(thread_id)
        return await self._run(self._read_sync, thread_id, after, limit, False)

    async def replay_events(self, thread_id: str) -> list[JournalEvent]:
        """Return the events from the last boundary on, reading from its remembered offset."""
        validate_thread_id(thread_id)
        return await self._run(self._read_sync, thread_id, 0, None, True)

    async def list_threads(self, *, cursor: str | None = None, limit: int = 50) -> ThreadPage:
        """Return a page of threads, newest update first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._run(self._list_sync, cursor, limit)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's journal."""
        validate_thread_id(thread_id)
        await self._run(self._delete_sync, thread_id)

    async def thread_size_bytes(self, thread_id: str) -> int | None:
        """Return the size of the thread's journal file in bytes."""
        path = self.journal_path(thread_id)

        def size() -> int:
            try:
                return os.stat(path).st_size
            except FileNotFoundError:
                raise ThreadNotFoundError(thread_id) from None

        return await self._run(size)

    async def aclose(self) -> None:
        """Close the store; later calls raise ``StoppedError``."""
        self._closed = True


class JsonlThreadStoreFactory(ThreadStoreFactory):
    """Opens JSONL thread stores under ``base_path`` (``durability``: fsync, group, none)."""

    id = "jsonl"

    def __init__(self, base_path: str | os.PathLike[str], *, durability: str = "fsync") -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"unknown durability {durability!r}; use one of {', '.join(DURABILITY_MODES)}"
            )
        self.base_path = Path(base_path).expanduser()
        self.durability = durability

    def _prepare(self) -> None:
        created = not self.base_path.exists()
        for sub in ("threads", "locks", "tmp"):
            (self.base_path / sub).mkdir(parents=True, exist_ok=True)
        if created and self.durability != "none":
            _fsync_dir(self.base_path)
            _fsync_dir(self.base_path.parent)

    async def open(self) -> JsonlThreadStore:
        """Return a store on ``base_path``, creating its directories (made durable)."""
        try:
            await anyio.to_thread.run_sync(self._prepare)
        except OSError as exc:
            raise StoreError(
                f"cannot use {self.base_path} for the JSONL thread store: {exc.strerror or exc}"
            ) from exc
        return JsonlThreadStore(self.base_path, durability=self.durability)

    def describe(self) -> str:
        """Return where the journals live."""
        return f"jsonl at {self.base_path} (durability {self.durability})"
