"""``roder migrate``: verbatim, verified, resumable and idempotent copies between stores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.events import ItemCompleted, JournalEvent
from roder_api.testing import ScriptedEngine
from roder_api.testing.conformance import (
    event_bytes,
    make_metadata,
    native_boundary,
    usage_event,
    user_item,
)
from roder_api.threads import ThreadMetadata, ThreadStoreFactory
from roder_api.transcript import ContextCompaction, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from .conftest import roder_command
from .postgres_support import require_postgres, temporary_schema

pytestmark = pytest.mark.anyio


def roder(*args: str, env: dict[str, str], expect: int = 0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*roder_command(), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == expect, f"roder {args}: {result.returncode}\n{result.stderr}"
    return result


async def populate(factory: JsonlThreadStoreFactory) -> list[str]:
    """Fill a JSONL store with varied threads: turns, usage, boundaries, unicode, metadata."""
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(factory)
    ids: list[str] = []
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        for index in range(3):
            tid = (await runtime.create_thread(title=f"chat {index} ✨")).thread_id
            for text in ("Hello!", "Größe und 日本語", "last one"):
                await runtime.run_turn(tid, text)
            ids.append(tid)
    store = await factory.open()
    try:
        tid = (
            await store.create_thread(make_metadata("hand-made", extra={"k": [1, "ü"]}))
        ).thread_id
        await store.append_events(tid, [user_item("a"), usage_event(3, 4)])
        await store.append_events(tid, [ItemCompleted("turn-1", ContextCompaction("sum"))])
        future = ItemCompleted("turn-2", UserMessage("x"), unknown_fields={"future": {"a": 1}})
        await store.append_events(tid, [native_boundary("turn-2"), future])
        await store.append_events(tid, [user_item(f"bulk {i}", "turn-3") for i in range(250)])
        await store.update_thread(tid, title="renamed")
        ids.append(tid)
        ids.append((await store.create_thread(make_metadata("empty-thread"))).thread_id)
    finally:
        await store.aclose()
    return ids


async def snapshot(factory: ThreadStoreFactory) -> dict[str, tuple[ThreadMetadata, list[bytes]]]:
    """Return every thread's metadata and its journal's canonical bytes."""
    store = await factory.open()
    try:
        out: dict[str, tuple[ThreadMetadata, list[bytes]]] = {}
        cursor = None
        while True:
            page = await store.list_threads(cursor=cursor, limit=2)
            for meta in page.threads:
                out[meta.thread_id] = (meta, event_bytes(await store.read_events(meta.thread_id)))
            cursor = page.next_cursor
            if cursor is None:
                return out
    finally:
        await store.aclose()


def report_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


async def test_round_trip_jsonl_sqlite_jsonl(tmp_path: Path, cli_env: dict[str, str]) -> None:
    source = JsonlThreadStoreFactory(base_path=tmp_path / "a")
    ids = await populate(source)
    db = tmp_path / "b.sqlite3"
    first = report_of(
        roder(
            "migrate",
            "--from",
            f"jsonl:{tmp_path / 'a'}",
            "--to",
            f"sqlite:{db}",
            "--json",
            "--chunk",
            "7",
            env=cli_env,
        )
    )
    assert first["threads"] == len(ids) and first["copied"] == len(ids)
    assert first["failed"] == 0 and first["verified"] == len(ids)
    assert first["events_copied"] == sum(r["events"] for r in first["results"])
    roder("migrate", "--from", f"sqlite:{db}", "--to", f"jsonl:{tmp_path / 'c'}", env=cli_env)
    original = await snapshot(source)
    assert await snapshot(SqliteThreadStoreFactory(db)) == original
    assert await snapshot(JsonlThreadStoreFactory(base_path=tmp_path / "c")) == original


@pytest.mark.postgres
@pytest.mark.slow
async def test_round_trip_jsonl_postgres_sqlite_jsonl(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    dsn = require_postgres()
    source = JsonlThreadStoreFactory(base_path=tmp_path / "a")
    ids = await populate(source)
    db = tmp_path / "b.sqlite3"
    with temporary_schema() as schema:
        pg = ["--to-option", f"schema={schema}"]
        to_pg = roder(
            "migrate",
            "--from",
            f"jsonl:{tmp_path / 'a'}",
            "--to",
            f"postgres:{dsn}",
            *pg,
            "--json",
            env=cli_env,
        )
        assert report_of(to_pg)["copied"] == len(ids)
        to_sqlite = roder(
            "migrate",
            "--from",
            f"postgres:{dsn}",
            "--from-option",
            f"schema={schema}",
            "--to",
            f"sqlite:{db}",
            "--json",
            env=cli_env,
        )
        assert report_of(to_sqlite)["verified"] == len(ids)
        from roder_postgres_thread_store import PostgresThreadStoreFactory

        in_postgres = await snapshot(PostgresThreadStoreFactory(dsn, schema=schema))
    back = roder(
        "migrate",
        "--from",
        f"sqlite:{db}",
        "--to",
        f"jsonl:{tmp_path / 'd'}",
        "--json",
        env=cli_env,
    )
    assert report_of(back)["failed"] == 0
    original = await snapshot(source)
    assert in_postgres == original
    assert await snapshot(SqliteThreadStoreFactory(db)) == original
    # Byte-identical event content after JSONL -> PostgreSQL -> SQLite -> JSONL.
    assert await snapshot(JsonlThreadStoreFactory(base_path=tmp_path / "d")) == original


async def test_second_run_copies_nothing(tmp_path: Path, cli_env: dict[str, str]) -> None:
    ids = await populate(JsonlThreadStoreFactory(base_path=tmp_path / "a"))
    args = ["migrate", "--from", f"jsonl:{tmp_path / 'a'}", "--to", f"sqlite:{tmp_path / 'b'}"]
    report_of(roder(*args, "--json", env=cli_env))
    again = report_of(roder(*args, "--json", env=cli_env))
    assert again["skipped"] == len(ids) and again["events_copied"] == 0
    assert again["copied"] == again["resumed"] == again["failed"] == 0
    human = roder(*args, env=cli_env).stdout
    assert f"{len(ids)} already complete" in human and "every thread verified" in human


async def test_a_partial_copy_is_resumed(tmp_path: Path, cli_env: dict[str, str]) -> None:
    source = JsonlThreadStoreFactory(base_path=tmp_path / "a")
    await populate(source)
    target = SqliteThreadStoreFactory(tmp_path / "b.sqlite3")
    # An interrupted earlier run: the thread exists at the target with part of its journal.
    src = await source.open()
    dst = await target.open()
    try:
        meta = await src.get_thread("hand-made")
        entries: list[JournalEvent] = await src.read_events("hand-made", limit=40)
        await dst.create_thread(meta)
        await dst.import_events("hand-made", entries)
    finally:
        await src.aclose()
        await dst.aclose()
    report = report_of(
        roder(
            "migrate",
            "--from",
            f"jsonl:{tmp_path / 'a'}",
            "--to",
            f"sqlite:{tmp_path / 'b.sqlite3'}",
            "--json",
            env=cli_env,
        )
    )
    [result] = [r for r in report["results"] if r["thread_id"] == "hand-made"]
    assert result["status"] == "resumed"
    assert result["events_copied"] == meta.last_sequence - 40
    assert report["failed"] == 0
    assert await snapshot(target) == await snapshot(source)


async def test_a_different_thread_at_the_target_is_reported(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    await populate(JsonlThreadStoreFactory(base_path=tmp_path / "a"))
    target = await SqliteThreadStoreFactory(tmp_path / "b.sqlite3").open()
    try:
        await target.create_thread(make_metadata("hand-made", created_at_ms=1))
    finally:
        await target.aclose()
    result = roder(
        "migrate",
        "--from",
        f"jsonl:{tmp_path / 'a'}",
        "--to",
        f"sqlite:{tmp_path / 'b.sqlite3'}",
        env=cli_env,
        expect=1,
    )
    assert "FAILED hand-made: the target holds a different thread" in result.stdout


def test_usage_errors(tmp_path: Path, cli_env: dict[str, str]) -> None:
    bad_spec = roder("migrate", "--from", "nocolon", "--to", "sqlite:x", env=cli_env, expect=2)
    assert "STORE:LOCATION" in bad_spec.stderr
    same = roder("migrate", "--from", "sqlite:x", "--to", "sqlite:x", env=cli_env, expect=2)
    assert "same store" in same.stderr
    unknown = roder("migrate", "--from", "nosuch:x", "--to", "sqlite:y", env=cli_env, expect=1)
    assert "unknown thread store id 'nosuch'" in unknown.stderr and "'sqlite'" in unknown.stderr
    option = roder(
        "migrate",
        "--from",
        "jsonl:x",
        "--to",
        "sqlite:y",
        "--to-option",
        "novalue",
        env=cli_env,
        expect=2,
    )
    assert "KEY=VALUE" in option.stderr


def test_a_terminal_sees_a_progress_bar(tmp_path: Path, cli_env: dict[str, str]) -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    anyio.run(populate, JsonlThreadStoreFactory(base_path=tmp_path / "a"))
    master, slave = pty.openpty()
    # A terminal of 100 columns (a fresh pseudo-terminal has none, and tqdm draws nothing).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        result = subprocess.run(
            [
                *roder_command(),
                "migrate",
                "--from",
                f"jsonl:{tmp_path / 'a'}",
                "--to",
                f"sqlite:{tmp_path / 'b.db'}",
            ],
            stdout=subprocess.PIPE,
            stderr=slave,
            env=cli_env,
            timeout=120,
        )
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end is closed: everything was read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    assert result.returncode == 0
    assert b"migrating threads" in shown and b"5/5" in shown
