"""``roder migrate``: a missing source is an error, sources are only read, re-runs converge.

Every test runs the installed ``roder`` console script in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from roder_api.testing.conformance import make_metadata, user_item
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_sqlite_thread_store import SqliteThreadStoreFactory

pytestmark = pytest.mark.anyio


def roder(*args: str, env: dict[str, str], expect: int = 0) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("roder")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "roder_runtime"]
    result = subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == expect, (
        f"roder {args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


def tree(root: Path) -> dict[str, str]:
    """Return every file under ``root`` with a hash of its bytes (empty when ``root`` is absent)."""
    if not root.exists():
        return {}
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_a_missing_source_is_an_error_and_creates_nothing(
    tmp_path: Path, cli_env: dict[str, str], kind: str
) -> None:
    missing = tmp_path / "typo" / ("threads" if kind == "jsonl" else "threads.db")
    target = tmp_path / "target.db"
    before = tree(tmp_path)
    result = roder(
        "migrate", "--from", f"{kind}:{missing}", "--to", f"sqlite:{target}", env=cli_env, expect=1
    )
    assert "does not exist" in result.stderr and str(missing) in result.stderr
    assert "verified" not in result.stdout
    assert tree(tmp_path) == before, "a failed migration created files"


async def test_the_source_is_only_read(tmp_path: Path, cli_env: dict[str, str]) -> None:
    jsonl = JsonlThreadStoreFactory(base_path=tmp_path / "a")
    store = await jsonl.open()
    try:
        for index in range(3):
            tid = (await store.create_thread(make_metadata(f"t{index}", title="x"))).thread_id
            await store.append_events(tid, [user_item(f"m{i}") for i in range(5)])
    finally:
        await store.aclose()
    roder(
        "migrate",
        "--from",
        f"jsonl:{tmp_path / 'a'}",
        "--to",
        f"sqlite:{tmp_path / 'b.db'}",
        env=cli_env,
    )
    for spec, path in (
        (f"jsonl:{tmp_path / 'a'}", tmp_path / "a"),
        (f"sqlite:{tmp_path / 'b.db'}", tmp_path / "b.db"),
    ):
        before = tree(path)
        roder("migrate", "--from", spec, "--to", f"sqlite:{tmp_path / 'c.db'}", env=cli_env)
        assert tree(path) == before, f"migrating from {spec} changed the source"


def report_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(result.stdout)
    return report


async def test_reruns_converge_after_metadata_changes(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    source = SqliteThreadStoreFactory(tmp_path / "a.db")
    store = await source.open()
    try:
        for tid in ("one", "two"):
            await store.create_thread(make_metadata(tid, title=f"title {tid}", extra={"k": 1}))
            await store.append_events(tid, [user_item("hello")])
    finally:
        await store.aclose()
    args = ["migrate", "--from", f"sqlite:{tmp_path / 'a.db'}", "--to", f"jsonl:{tmp_path / 'b'}"]
    assert report_of(roder(*args, "--json", env=cli_env))["copied"] == 2
    store = await source.open()
    try:
        await store.update_thread("one", title="renamed")
        await store.update_thread("two", extra={"k": 2, "new": [1, "ü"]})
    finally:
        await store.aclose()
    second = report_of(roder(*args, "--json", env=cli_env))
    assert second["failed"] == 0 and second["updated"] == 2, second
    by_id = {r["thread_id"]: r for r in second["results"]}
    assert by_id["one"]["status"] == "updated" and by_id["one"]["updated_fields"] == ["title"]
    assert by_id["two"]["updated_fields"] == ["extra"]
    target = await JsonlThreadStoreFactory(base_path=tmp_path / "b").open()
    try:
        assert (await target.get_thread("one")).title == "renamed"
        assert (await target.get_thread("two")).extra == {"k": 2, "new": [1, "ü"]}
    finally:
        await target.aclose()
    third = report_of(roder(*args, "--json", env=cli_env))
    assert third["skipped"] == 2 and third["updated"] == 0 and third["failed"] == 0, third
    human = roder(*args, env=cli_env).stdout
    assert "0 metadata updated" in human and "every thread verified" in human


@pytest.mark.postgres
def test_a_missing_postgres_source_schema_is_an_error_and_creates_nothing(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    import psycopg

    from .postgres_support import require_postgres, temporary_schema

    dsn = require_postgres()
    with temporary_schema() as schema:
        result = roder(
            "migrate",
            "--from",
            f"postgres:{dsn}",
            "--from-option",
            f"schema={schema}",
            "--to",
            f"sqlite:{tmp_path / 'target.db'}",
            env=cli_env,
            expect=1,
        )
        assert "verified" not in result.stdout
        with psycopg.connect(dsn) as conn:
            found = conn.execute(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
                (schema,),
            ).fetchone()
        assert found is not None and found[0] == 0, "the missing source schema was created"
    assert tree(tmp_path / "target.db") == {}
