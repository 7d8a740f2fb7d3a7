"""Damage a user or bit rot makes to a store is refused, never read as something else.

Real files edited as a user would (lines of a JSONL journal swapped, duplicated or cut at a
line boundary, the size unchanged or the cut clean), real SQLite files and real PostgreSQL
rows updated and deleted with SQL; read through the public API and the ``roder`` command.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from roder_api.errors import StoreCorruptedError
from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata, ThreadStore, ThreadStoreFactory
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

from .conftest import roder_command
from .postgres_support import require_postgres, temporary_schema

THREAD = "damaged"
ITEMS = 6


def roder(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*roder_command(), *args], capture_output=True, text=True, env=env, timeout=60
    )


def configure(env: dict[str, str], table: str) -> None:
    home = Path(env["RODER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(textwrap.dedent(table))


def seed(factory: ThreadStoreFactory, thread_id: str = THREAD, items: int = ITEMS) -> None:
    """Create a thread of ``items`` one-event lines of equal length (item 1 .. item N)."""

    async def main() -> None:
        store = await factory.open()
        async with store:
            await store.create_thread(ThreadMetadata(thread_id, 1000, 1000))
            for i in range(1, items + 1):
                await store.append_events(
                    thread_id, [ItemCompleted("turn", UserMessage(f"item {i}"))]
                )

    anyio.run(main)


async def outcome(factory: ThreadStoreFactory, call: str, after: int | None = None) -> Any:
    """Return what ``store.<call>(THREAD)`` returns or raises, on a fresh store."""
    store: ThreadStore = await factory.open()
    try:
        if after is not None:
            return await getattr(store, call)(THREAD, after=after)
        return await getattr(store, call)(THREAD)
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        return exc
    finally:
        await store.aclose()


def assert_refused(factory: ThreadStoreFactory, *, sequence: int | None = None) -> None:
    """Every read of THREAD raises StoreCorruptedError naming it (and where)."""
    for call in ("read_events", "read_snapshot", "replay_events"):
        got = anyio.run(outcome, factory, call)
        assert isinstance(got, StoreCorruptedError), (call, got)
        assert got.thread_id == THREAD, (call, got)
        assert THREAD in str(got)
        if sequence is not None:
            assert f"sequence {sequence}" in str(got), (call, got)


# --- JSONL ---------------------------------------------------------------------------------


def journal_of(base: Path) -> Path:
    return base / "threads" / f"{THREAD}.jsonl"


def jsonl_lines(base: Path) -> list[bytes]:
    lines = journal_of(base).read_bytes().splitlines(keepends=True)
    # The create line, then ITEMS events lines of one length: equal-length edits are possible.
    assert len(lines) == ITEMS + 1 and len({len(line) for line in lines[1:]}) == 1
    return lines


def sequences_in(journal: Path) -> list[int]:
    out = []
    for line in journal.read_bytes().splitlines():
        record = json.loads(line)["r"]
        if record["k"] == "events":
            out.append(record["seq"])
    return out


def append_refused(factory: ThreadStoreFactory, journal: Path, *, read_first: bool) -> None:
    """The next append raises StoreCorruptedError and writes nothing.

    ``read_first``: the store reads the thread first (as a session that resumes it does).
    """
    before = journal.read_bytes()

    async def main() -> Any:
        store = await factory.open()
        async with store:
            if read_first:
                with pytest.raises(StoreCorruptedError):
                    await store.read_events(THREAD)
            try:
                return await store.append_events(THREAD, [ItemCompleted("t", UserMessage("x"))])
            except Exception as exc:  # noqa: BLE001 - looked at below
                return exc

    got = anyio.run(main)
    assert isinstance(got, StoreCorruptedError), got
    assert journal.read_bytes() == before


def cli_refuses(env: dict[str, str], kind: str) -> None:
    shown = roder("threads", "show", THREAD, env=env)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert THREAD in shown.stderr and "damaged" in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr
    checked = roder("fsck", "--json", env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    report = {t["thread_id"]: t for t in json.loads(checked.stdout)["threads"]}
    assert report[THREAD]["status"] == "damaged"
    assert report[THREAD]["damage"]["kind"] == kind, report[THREAD]


@pytest.mark.parametrize("edit", ["swap", "duplicate"])
def test_jsonl_equal_length_lines_swapped_or_duplicated_are_damage(
    cli_env: dict[str, str], edit: str
) -> None:
    base = Path(cli_env["RODER_HOME"]) / "threads"
    factory = JsonlThreadStoreFactory(base)
    seed(factory)
    journal = journal_of(base)
    lines = jsonl_lines(base)
    size = journal.stat().st_size
    if edit == "swap":
        lines[3], lines[4] = lines[4], lines[3]  # sequences 3 and 4
    else:
        lines[4] = lines[3]  # sequence 3 twice, 4 gone
    journal.write_bytes(b"".join(lines))
    assert journal.stat().st_size == size
    assert sequences_in(journal) == ([1, 2, 4, 3, 5, 6] if edit == "swap" else [1, 2, 3, 3, 5, 6])

    assert_refused(factory)
    # A read from the middle, and the tail, check what they read too.
    got = anyio.run(outcome, factory, "read_events", 2)
    assert isinstance(got, StoreCorruptedError), got
    append_refused(factory, journal, read_first=True)
    cli_refuses(cli_env, "sequence")


def test_jsonl_swapped_last_lines_refuse_the_next_append_of_a_fresh_store(
    cli_env: dict[str, str],
) -> None:
    """An append that reads nothing first still does not write after a swapped tail."""
    base = Path(cli_env["RODER_HOME"]) / "threads"
    factory = JsonlThreadStoreFactory(base)
    seed(factory)
    journal = journal_of(base)
    lines = jsonl_lines(base)
    lines[-1], lines[-2] = lines[-2], lines[-1]
    journal.write_bytes(b"".join(lines))
    append_refused(factory, journal, read_first=False)
    assert sequences_in(journal) == [1, 2, 3, 4, 6, 5]


def test_jsonl_journal_cut_at_a_line_boundary_is_damage(cli_env: dict[str, str]) -> None:
    base = Path(cli_env["RODER_HOME"]) / "threads"
    factory = JsonlThreadStoreFactory(base)
    seed(factory)
    journal = journal_of(base)
    lines = jsonl_lines(base)
    journal.write_bytes(b"".join(lines[:-2]))  # sequences 5 and 6 are gone, cleanly
    assert sequences_in(journal) == [1, 2, 3, 4]

    assert_refused(factory)
    got = anyio.run(outcome, factory, "get_thread")
    assert isinstance(got, StoreCorruptedError) and "sequence 6" in str(got), got
    append_refused(factory, journal, read_first=False)  # sequence 5 is never written twice
    append_refused(factory, journal, read_first=True)
    cli_refuses(cli_env, "truncated")


def test_jsonl_store_copied_with_cp_a_checks_clean(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A restored backup (other inode numbers, same bytes) is a healthy store."""
    original = tmp_path / "original"
    factory = JsonlThreadStoreFactory(original)
    seed(factory)
    seed(factory, "other", 3)
    restored = tmp_path / "restored"
    subprocess.run(["cp", "-a", str(original), str(restored)], check=True, timeout=60)
    configure(cli_env, f'[thread_store]\nbackend = "jsonl"\npath = "{restored}"\n')
    for _ in range(2):  # the first check may refresh the index rows; the second too is clean
        checked = roder("fsck", "--json", env=cli_env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        report = json.loads(checked.stdout)
        assert report["damaged"] == 0 and report["checked"] == 2, report
        assert {t["status"] for t in report["threads"]} == {"ok"}
    shown = roder("threads", "show", THREAD, env=cli_env)
    assert shown.returncode == 0 and "item 6" in shown.stdout, shown.stderr

    async def append() -> int:
        store = await JsonlThreadStoreFactory(restored).open()
        async with store:
            done = await store.append_events(THREAD, [ItemCompleted("t", UserMessage("more"))])
            return done[-1].sequence

    assert anyio.run(append) == ITEMS + 1
    assert roder("fsck", env=cli_env).returncode == 0


# --- SQLite and PostgreSQL -----------------------------------------------------------------

BAD_ROWS = {
    "bad_json": "not json {",
    "not_tagged": '{"hello": "world"}',
}


def relational_refuses(env: dict[str, str], factory: ThreadStoreFactory, sequence: int) -> None:
    assert_refused(factory, sequence=sequence)
    shown = roder("threads", "show", THREAD, env=env)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert THREAD in shown.stderr and f"sequence {sequence}" in shown.stderr, shown.stderr
    assert "ValueError" not in shown.stderr and "JSONDecodeError" not in shown.stderr
    assert "Traceback" not in shown.stderr


@pytest.mark.parametrize("damage", [*BAD_ROWS, "deleted", "deleted_last"])
def test_sqlite_damaged_or_deleted_event_row_is_damage(
    cli_env: dict[str, str], tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "threads.sqlite3"
    factory = SqliteThreadStoreFactory(path)
    seed(factory)
    configure(cli_env, f'[thread_store]\nbackend = "sqlite"\npath = "{path}"\n')
    sequence = ITEMS if damage == "deleted_last" else 3
    with sqlite3.connect(path) as conn:
        if damage in BAD_ROWS:
            conn.execute(
                "UPDATE roder_events SET event = ? WHERE thread_id = ? AND sequence = ?",
                (BAD_ROWS[damage], THREAD, sequence),
            )
        else:
            conn.execute(
                "DELETE FROM roder_events WHERE thread_id = ? AND sequence = ?", (THREAD, sequence)
            )
    conn.close()
    relational_refuses(cli_env, factory, sequence)


@pytest.mark.parametrize("damage", [*BAD_ROWS, "deleted", "deleted_last"])
def test_postgres_damaged_or_deleted_event_row_is_damage(
    cli_env: dict[str, str], damage: str
) -> None:
    import psycopg
    from psycopg import sql

    from roder_postgres_thread_store import PostgresThreadStoreFactory

    dsn = require_postgres()
    with temporary_schema() as schema:
        factory = PostgresThreadStoreFactory(dsn, schema=schema)
        seed(factory)
        configure(
            cli_env,
            f'[thread_store]\nbackend = "postgres"\ndsn = "{dsn}"\nschema = "{schema}"\n',
        )
        sequence = ITEMS if damage == "deleted_last" else 3
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(schema, "roder_events")
            if damage in BAD_ROWS:
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET event = %s WHERE thread_id = %s AND sequence = %s"
                    ).format(table),
                    (BAD_ROWS[damage], THREAD, sequence),
                )
            else:
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE thread_id = %s AND sequence = %s").format(table),
                    (THREAD, sequence),
                )
        relational_refuses(cli_env, factory, sequence)
