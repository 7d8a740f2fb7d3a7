"""Reads never write: list, show, export, replay and fsck change no file of a JSONL store,
and work on a directory nobody may write (checked by a process the kernel holds to the
file modes, for real).

Run as root, the reader is root without any capability (``setpriv`` clears them), not
another user: root without ``CAP_DAC_OVERRIDE`` cannot write a file or directory whose
write bits are off, yet can still run the interpreter of a clone kept in a directory only
its owner may enter (a clone in a 0700 home, where another user could not start Python).
Run as anyone else, the reader is simply that user.
"""

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

WITHOUT_CAPABILITIES = ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all")
"""What runs a command as this user but held to file modes (root loses its override)."""

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
    """A RODER_HOME of its own, removed after (its modes are put back first)."""
    top = Path(tempfile.mkdtemp(prefix="roder-ro-"))
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


def held_to_modes(command: list[str]) -> list[str]:
    """Return ``command`` run so that file modes bind it (root: without capabilities)."""
    return [*WITHOUT_CAPABILITIES, *command] if os.geteuid() == 0 else command


def roder(home: Path, *args: str, held: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(home)
    env["HOME"] = str(home)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [*roder_command(), *args]
    if held:
        command = held_to_modes(command)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def check_reads(home: Path, held: bool) -> None:
    before = snapshot(home)
    for args in READS:
        result = roder(home, *args, held=held)
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
    check_reads(home, held=False)


def test_reads_work_on_a_directory_nobody_may_write(home: Path) -> None:
    make_store(home)
    for path in [home, *home.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
    probe = subprocess.run(
        held_to_modes(["touch", str(home / "threads" / "probe")]), capture_output=True
    )
    assert probe.returncode != 0  # the directory really is read-only to the reader
    check_reads(home, held=True)
