"""``roder fsck``: checking, repairing and reindexing the JSONL store in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import anyio

from roder_api.events import ItemCompleted
from roder_api.threads import ThreadMetadata
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory

from .conftest import roder_command


def roder(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*roder_command(), *args], capture_output=True, text=True, env=env, timeout=60
    )


def make_store(env: dict[str, str], threads: dict[str, int]) -> Path:
    base = Path(env["RODER_HOME"]) / "threads"

    async def build() -> None:
        store = await JsonlThreadStoreFactory(base).open()
        for n, (thread_id, count) in enumerate(threads.items()):
            await store.create_thread(ThreadMetadata(thread_id, 1000 + n, 1000 + n))
            for i in range(count):
                await store.append_events(
                    thread_id, [ItemCompleted("turn", UserMessage(f"{thread_id} {i}"))]
                )
        await store.aclose()

    anyio.run(build)
    return base


def damage_line(path: Path, line: int) -> bytes:
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1].replace(b'"text":"', b'"text":"X', 1)
    path.write_bytes(b"\n".join(lines))
    return path.read_bytes()


def test_fsck_passes_a_healthy_store(cli_env: dict[str, str]) -> None:
    make_store(cli_env, {"a": 2, "b": 3})
    result = roder("fsck", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert "checked 2 threads: 0 damaged" in result.stdout
    report = json.loads(roder("fsck", "--json", env=cli_env).stdout)
    assert report["checked"] == 2 and report["damaged"] == 0
    assert {t["thread_id"]: t["status"] for t in report["threads"]} == {"a": "ok", "b": "ok"}


def test_fsck_reports_damage_and_repair_quarantines_it(cli_env: dict[str, str]) -> None:
    base = make_store(cli_env, {"good": 2, "bad": 5})
    journal = base / "threads" / "bad.jsonl"
    original = journal.read_bytes()
    damage_line(journal, 3)  # line 3 = the second events line: mid-file damage
    damaged = journal.read_bytes()
    result = roder("fsck", env=cli_env)
    assert result.returncode == 1
    assert "bad: line 3" in result.stdout and "mid_file" in result.stdout
    assert "roder fsck --repair" in result.stdout
    assert journal.read_bytes() == damaged  # checking changes nothing

    result = roder("fsck", "--repair", "--json", env=cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = {t["thread_id"]: t for t in json.loads(result.stdout)["threads"]}
    assert report["good"]["status"] == "ok"
    repair = report["bad"]["repair"]
    assert report["bad"]["status"] == "repaired"
    quarantine = Path(repair["quarantine"])
    assert quarantine.parent == journal.parent and quarantine.name.startswith("bad.jsonl.")
    # Nothing is deleted: the journal's prefix plus the quarantine are the damaged file.
    assert journal.read_bytes() + quarantine.read_bytes() == damaged
    assert original.startswith(journal.read_bytes())
    assert roder("fsck", env=cli_env).returncode == 0

    async def check() -> None:
        store = await JsonlThreadStoreFactory(base).open()
        assert [e.sequence for e in await store.read_events("bad")] == [1]
        appended = await store.append_events("bad", [ItemCompleted("t", UserMessage("again"))])
        assert appended[0].sequence == 2
        listed = {m.thread_id: m for m in (await store.list_threads()).threads}
        assert listed["bad"].item_count == 2
        await store.aclose()

    anyio.run(check)


def test_fsck_reindex_rebuilds_a_lost_index(cli_env: dict[str, str]) -> None:
    base = make_store(cli_env, {"x": 1, "y": 2})
    # A journal copied in by hand is unknown to the index until a reindex.
    elsewhere = make_store({"RODER_HOME": str(base.parent / "elsewhere")}, {"copied": 3})
    (base / "threads" / "copied.jsonl").write_bytes(
        (elsewhere / "threads" / "copied.jsonl").read_bytes()
    )
    # A journal under a name that is not its thread's is damage, never listed.
    (base / "threads" / "misnamed.jsonl").write_bytes((base / "threads" / "y.jsonl").read_bytes())
    result = roder("fsck", env=cli_env)
    assert result.returncode == 1 and "copied: index missing" in result.stdout
    assert "misnamed: line 1" in result.stdout
    (base / "threads" / "misnamed.jsonl").unlink()
    result = roder("fsck", "--reindex", env=cli_env)
    assert result.returncode == 0, result.stdout
    assert "index rebuilt (3 threads)" in result.stdout
    listed = roder("threads", "list", "--json", env=cli_env)
    assert {t["thread_id"] for t in json.loads(listed.stdout)["threads"]} == {"x", "y", "copied"}
    assert roder("fsck", env=cli_env).returncode == 0


def test_fsck_refuses_other_stores_clearly(cli_env: dict[str, str], tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "roder_other-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: roder-other\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[roder]\nother = roder_other_store\n")
    (site / "roder_other_store.py").write_text(
        textwrap.dedent(
            """
            from roder_api import hookimpl
            from roder_api.threads import ThreadStore, ThreadStoreFactory

            class Store(ThreadStore):
                pass

            Store.__abstractmethods__ = frozenset()

            class Factory(ThreadStoreFactory):
                id = "other"

                async def open(self):
                    return Store()

            @hookimpl
            def register_thread_store_factories(register):
                register(Factory())
            """
        )
    )
    home = Path(cli_env["RODER_HOME"])
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[thread_store]\nbackend = "other"\n')
    cli_env["PYTHONPATH"] = str(site)
    result = roder("fsck", env=cli_env)
    assert result.returncode == 1
    assert "roder fsck checks JSONL thread stores" in result.stderr


def test_fsck_reports_a_flipped_bit_in_the_last_line_and_only_repair_moves_it(
    cli_env: dict[str, str],
) -> None:
    base = make_store(cli_env, {"a": 3})
    journal = base / "threads" / "a.jsonl"
    data = journal.read_bytes()
    position = data.rindex(b'"text":"') + 9  # inside the last complete line's record
    damaged = data[:position] + bytes([data[position] ^ 0x04]) + data[position + 1 :]
    journal.write_bytes(damaged)
    for index in base.glob("index.sqlite3*"):
        index.unlink()  # the store must judge the journal from its lines alone
    for _ in range(2):  # checking twice: the first check must not have "fixed" anything
        result = roder("fsck", env=cli_env)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "a: line 4" in result.stdout and "1 damaged" in result.stdout
        assert journal.read_bytes() == damaged
    result = roder("fsck", "--repair", "--json", env=cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    repair = json.loads(result.stdout)["threads"][0]["repair"]
    assert journal.read_bytes() + Path(repair["quarantine"]).read_bytes() == damaged
    assert roder("fsck", env=cli_env).returncode == 0
