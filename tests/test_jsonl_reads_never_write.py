"""Reads never write: list, show, export, replay and fsck change no file of a JSONL store,
and work on a directory nobody may write (checked as an unprivileged user, for real)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory

from .conftest import roder_command

NOBODY = 65534

READS = (
    ("threads", "list"),
    ("threads", "list", "--json"),
    ("threads", "show", "a"),
    ("threads", "show", "torn", "--json"),
    ("threads", "export", "a"),
    ("threads", "export", "torn", "--format", "markdown"),
    ("replay", "a"),
    ("replay", "torn"),
    ("fsck",),
    ("fsck", "--json"),
)


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int, int]]:
    """Return every path under ``root`` with its bytes, mode and mtime (files).

    Directories are listed with their mode only: SQLite's WAL mode makes a reader of the
    index create (and on close remove) its ``-shm`` and ``-wal`` files, which bumps the
    directory's mtime; every file that stays is checked byte for byte.
    """
    out: dict[str, tuple[bytes | None, int, int]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(path.relative_to(root))] = (path.read_bytes(), st.st_mode, st.st_mtime_ns)
        else:
            out[str(path.relative_to(root))] = (None, st.st_mode, 0)
    return out


@pytest.fixture
def home() -> Iterator[Path]:
    """A RODER_HOME that an unprivileged user can reach (pytest's tmp dirs are root-only)."""
    top = Path(tempfile.mkdtemp(prefix="roder-ro-"))
    top.chmod(0o755)
    try:
        yield top / "home"
    finally:
        for path in [top, *top.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(top)


def make_store(home: Path) -> tuple[Path, bytes]:
    """Build a store with a healthy thread ``a`` and a thread ``torn`` with a torn tail."""
    base = home / "threads"

    async def build() -> None:
        store = await JsonlThreadStoreFactory(base).open()
        for thread_id in ("a", "torn"):
            await store.create_thread(ThreadMetadata(thread_id, 1000, 1000))
            for i in range(3):
                item = ItemCompleted("turn", UserMessage(f"{thread_id} {i}"))
                await store.append_events(thread_id, [item])
        await store.update_thread("a", title="the title")
        await store.aclose()

    anyio.run(build)
    torn = b'{"c":"00000000","r":{"v":1,"k":"events","seq":4,"t":5,"ev'
    with open(base / "threads" / "torn.jsonl", "ab") as file:
        file.write(torn)
    return base, torn


def roder(home: Path, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(home)
    env["HOME"] = str(home)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [*roder_command(), *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def check_reads(home: Path, user: int | None) -> None:
    before = snapshot(home)
    for args in READS:
        result = roder(home, *args, user=user)
        expected = 1 if args[0] == "fsck" else 0  # the torn tail is reported, not cut
        assert result.returncode == expected, (args, result.stdout, result.stderr)
        for alarm in (
            "unusable",
            "rebuilding",
            "cut a torn",
            "Permission denied",
            "Read-only",
            "Traceback",
        ):
            assert alarm not in result.stderr, (args, result.stderr)
        if args == ("threads", "show", "torn", "--json"):
            shown = json.loads(result.stdout)
            assert shown["metadata"]["last_sequence"] == 3, shown
        if args == ("threads", "list", "--json"):
            listed = {t["thread_id"]: t for t in json.loads(result.stdout)["threads"]}
            assert listed["a"]["title"] == "the title" and listed["torn"]["last_sequence"] == 3
        if args == ("fsck", "--json"):
            report = json.loads(result.stdout)
            status = {t["thread_id"]: t["status"] for t in report["threads"]}
            assert status == {"a": "ok", "torn": "damaged"}, report
    assert snapshot(home) == before  # not one byte, mode or mtime changed


def test_reads_change_no_file(home: Path) -> None:
    make_store(home)
    check_reads(home, user=None)


def test_reads_work_on_a_directory_nobody_may_write(home: Path) -> None:
    make_store(home)
    for path in [home, *home.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod((mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)) & ~0o222)
    probe = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "touch",
            str(home / "threads" / "probe"),
        ],
        capture_output=True,
    )
    assert probe.returncode != 0  # the directory really is read-only to that user
    check_reads(home, user=NOBODY)
