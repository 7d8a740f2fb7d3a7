"""``examples/swap_backends.py`` runs the same agent on every store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .postgres_support import temporary_schema, unreachable_reason


def run_example(tmp_path: Path, env: dict[str, str], schema: str) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "swap_backends.py"), str(tmp_path), schema],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_swap_backends_on_jsonl_and_sqlite(tmp_path: Path, cli_env: dict[str, str]) -> None:
    out = run_example(tmp_path, cli_env, "unused")
    for name in ("jsonl", "sqlite"):
        assert f"{name}: 4 items, 25 tokens\n" in out
        assert f"{name} after a restart: 1 thread(s)\n" in out
    assert "postgres: skipped" in out
    assert list((tmp_path / "threads" / "threads").glob("*.jsonl"))
    assert (tmp_path / "threads.db").exists()


@pytest.mark.postgres
def test_swap_backends_on_postgres_too(tmp_path: Path, cli_env: dict[str, str]) -> None:
    reason = unreachable_reason()
    if reason is not None:
        pytest.skip(reason)
    from .postgres_support import postgres_test_dsn

    cli_env["RODER_POSTGRES_DSN"] = postgres_test_dsn()
    with temporary_schema("roder_example") as schema:
        out = run_example(tmp_path, cli_env, schema)
    for name in ("jsonl", "sqlite", "postgres"):
        assert f"{name}: 4 items, 25 tokens\n" in out
        assert f"{name} after a restart: 1 thread(s)\n" in out
