"""``roder threads list|show|export|delete|fork|prune`` in real subprocesses on a real store."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from roder_api.codec import from_dict, loads
from roder_api.events import JournalEvent
from roder_api.transcript import AssistantMessage, ToolCallRecord, ToolResultRecord, UserMessage

from ._cli_store import (
    Seed,
    chat_turns,
    read_journal,
    roder_on_terminal,
    seed,
    store_base,
    tree,
)
from .test_cli import roder


def ids(listing: dict[str, object]) -> list[str]:
    threads = listing["threads"]
    assert isinstance(threads, list)
    return [t["thread_id"] for t in threads]


def list_json(env: dict[str, str], *args: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(
        roder("threads", "list", "--json", *args, env=env).stdout
    )
    return result


def test_list_filters_by_title_and_update_time_and_pages(cli_env: dict[str, str]) -> None:
    seed(
        cli_env,
        Seed("t-now", "Release notes draft", 0),
        Seed("t-2d", "bug: crash on start", 2),
        Seed("t-10d", "Bug triage", 10),
        Seed("t-40d", "old release notes", 40),
        Seed("t-90d", None, 90),
    )
    assert ids(list_json(cli_env)) == ["t-now", "t-2d", "t-10d", "t-40d", "t-90d"]
    assert ids(list_json(cli_env, "--title", "BUG")) == ["t-2d", "t-10d"]
    assert ids(list_json(cli_env, "--title", "release notes")) == ["t-now", "t-40d"]
    assert ids(list_json(cli_env, "--updated-after", "7d")) == ["t-now", "t-2d"]
    assert ids(list_json(cli_env, "--updated-before", "30d")) == ["t-40d", "t-90d"]
    now = dt.datetime.now(dt.timezone.utc)
    after = (now - dt.timedelta(days=50)).date().isoformat()
    before = (now - dt.timedelta(days=5)).strftime("%Y-%m-%dT%H:%M:%S")
    window = list_json(cli_env, "--updated-after", after, "--updated-before", before)
    assert ids(window) == ["t-10d", "t-40d"]
    zoned = (now - dt.timedelta(days=5)).isoformat()  # carries +00:00
    assert ids(list_json(cli_env, "--updated-before", zoned)) == ["t-10d", "t-40d", "t-90d"]

    # Paging, with and without a filter: the cursors walk every match exactly once.
    for extra in ([], ["--updated-before", "1d"]):
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            args = [*extra, "--limit", "2"] + (["--cursor", cursor] if cursor else [])
            page = list_json(cli_env, *args)
            seen += ids(page)
            pages += 1
            cursor = page["next_cursor"]  # type: ignore[assignment]
            if cursor is None:
                break
        expected = ["t-now", "t-2d", "t-10d", "t-40d", "t-90d"][1 if extra else 0 :]
        assert seen == expected
        assert pages == (2 if extra else 3)

    human = roder("threads", "list", "--limit", "2", "--title", "e", env=cli_env).stdout
    lines = human.splitlines()
    assert lines[0].startswith("t-now  ") and lines[0].endswith("Release notes draft")
    assert lines[-1].startswith("more: roder threads list --title e --limit 2 --cursor ")
    assert lines[1].startswith("t-10d  ")
    follow = roder(*lines[-1].split()[2:], env=cli_env).stdout
    assert follow == roder("threads", "list", "--title", "old", env=cli_env).stdout
    assert roder("threads", "list", "--title", "zzz", env=cli_env).stdout == "no threads match\n"


def test_list_rejects_bad_arguments_with_exit_2(cli_env: dict[str, str]) -> None:
    for args in (
        ["--updated-after", "last tuesday"],
        ["--limit", "0"],
        ["--cursor", "not-a-cursor"],
    ):
        result = roder("threads", "list", *args, env=cli_env, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        # One error line (after argparse's usage reminder, for argument errors).
        assert result.stderr.strip().splitlines()[-1].startswith(("roder", "usage"))
        assert sum("error:" in line for line in result.stderr.splitlines()) == 1
    bad = roder("threads", "list", "--updated-after", "last tuesday", env=cli_env, check=False)
    assert "invalid time 'last tuesday'" in bad.stderr


def test_show_prints_the_transcript_and_with_events_the_raw_journal(
    cli_env: dict[str, str],
) -> None:
    thread_id = chat_turns(cli_env, "hello", "again", args=["--title", "demo"])
    _, journal = read_journal(cli_env, thread_id)

    raw = json.loads(roder("threads", "show", thread_id, "--events", "--json", env=cli_env).stdout)
    assert raw["metadata"]["thread_id"] == thread_id
    assert [from_dict(e) for e in raw["events"]] == journal
    assert [e["sequence"] for e in raw["events"]] == list(range(1, len(journal) + 1))

    human = roder("threads", "show", thread_id, "--events", env=cli_env).stdout.splitlines()
    assert human[0] == f"thread: {thread_id}  (demo)"
    assert f"{len(journal)} events" in human[1]
    event_lines = human[2:]
    assert len(event_lines) == len(journal)
    assert event_lines[0].split()[0] == "1" and "turn_started" in event_lines[0]
    assert any("item_completed  you> hello" in line for line in event_lines)
    assert any("usage_updated  turn:" in line for line in event_lines)

    transcript = roder("threads", "show", thread_id, env=cli_env).stdout
    assert "you> again" in transcript and "assistant> You said: again" in transcript


def test_export_jsonl_is_the_journal_verbatim_and_markdown_reads_well(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    seed(
        cli_env,
        Seed(
            "t-export",
            "Export me",
            1,
            turns=[
                [UserMessage("what is 2+2?"), ToolCallRecord("c1", "calc", '{"expr": "2+2"}')],
                [ToolResultRecord("c1", "calc", "4"), AssistantMessage("It is 4.")],
            ],
        ),
    )
    meta, journal = read_journal(cli_env, "t-export")
    out = roder("threads", "export", "t-export", env=cli_env).stdout
    lines = out.splitlines()
    assert loads(lines[0]) == meta
    assert [loads(line) for line in lines[1:]] == journal
    assert all(isinstance(loads(line), JournalEvent) for line in lines[1:])

    target = tmp_path / "out" / "thread.jsonl"
    target.parent.mkdir()
    summary = roder(
        "threads", "export", "t-export", "-o", str(target), "--json", env=cli_env
    ).stdout
    assert target.read_text() == out
    assert json.loads(summary) == {
        "thread_id": "t-export",
        "format": "jsonl",
        "path": str(target),
        "events": len(journal),
        "bytes": len(out.encode()),
    }

    md = roder("threads", "export", "t-export", "--format", "markdown", env=cli_env).stdout
    assert md.startswith("# Export me\n")
    assert "## Turn 1" in md and "## Turn 2" in md
    assert "**You:**\n\nwhat is 2+2?" in md
    assert '**Tool call** `calc` (`c1`):\n\n```json\n{"expr": "2+2"}\n```' in md
    assert "**Assistant:**\n\nIt is 4." in md
    md_file = tmp_path / "thread.md"
    human = roder(
        "threads", "export", "t-export", "--format", "markdown", "-o", str(md_file), env=cli_env
    ).stdout
    assert md_file.read_text() == md and human.startswith("exported thread t-export (markdown")

    missing = roder("threads", "export", "nope", env=cli_env, check=False)
    assert missing.returncode == 1 and "thread 'nope' was not found" in missing.stderr
    unwritable = roder(
        "threads",
        "export",
        "t-export",
        "-o",
        str(tmp_path / "no" / "dir" / "x"),
        env=cli_env,
        check=False,
    )
    assert unwritable.returncode == 1
    target = tmp_path / "no" / "dir" / "x"
    # The error names the path the user gave (not a temporary file beside it).
    assert unwritable.stderr.startswith(f"roder: error: cannot write {target}: no such directory")
    assert "Traceback" not in unwritable.stderr and len(unwritable.stderr.splitlines()) == 1
    debug = roder(
        "--debug",
        "threads",
        "export",
        "t-export",
        "-o",
        str(tmp_path / "no" / "x"),
        env=cli_env,
        check=False,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert not list(tmp_path.glob("no*"))
    usage = roder("threads", "export", "t-export", "--json", env=cli_env, check=False)
    assert usage.returncode == 2 and "--json needs -o FILE" in usage.stderr


def test_fork_copies_the_journal_up_to_a_sequence_and_leaves_the_source_byte_identical(
    cli_env: dict[str, str],
) -> None:
    source = chat_turns(cli_env, "first", "second", args=["--title", "origin"])
    source_meta, source_journal = read_journal(cli_env, source)
    journal_file = store_base(cli_env) / "threads" / f"{source}.jsonl"
    before = journal_file.read_bytes()

    # Fork right after the first turn's user message.
    at = next(
        e.sequence
        for e in source_journal
        if getattr(getattr(e.event, "item", None), "text", None) == "first"
    )
    forked = json.loads(
        roder("threads", "fork", source, "--at", str(at), "--json", env=cli_env).stdout
    )
    fork_id = forked["thread_id"]
    assert forked["forked_from"] == {"thread_id": source, "sequence": at}
    assert forked["events_copied"] == at and forked["title"] == "origin (fork)"
    assert journal_file.read_bytes() == before
    fork_meta, fork_journal = read_journal(cli_env, fork_id)
    assert fork_journal == source_journal[:at]  # same sequences, times and events
    assert fork_meta.extra["forked_from"] == {"thread_id": source, "sequence": at}
    assert fork_meta.item_count == 1 and fork_meta.last_sequence == at

    # The default forks everything; --title names it; the fork is a thread like any other.
    human = roder("threads", "fork", source, "--title", "copy", env=cli_env).stdout.splitlines()
    whole = human[0].split()[1]
    assert human[1] == (
        f"forked from {source} at sequence {source_meta.last_sequence} "
        f"({len(source_journal)} events, 4 items copied)"
    )
    whole_meta, whole_journal = read_journal(cli_env, whole)
    assert whole_journal == source_journal and whole_meta.title == "copy"
    assert whole_meta.usage == source_meta.usage
    resumed = roder("chat", "--thread", fork_id, env=cli_env, stdin="third\n")
    assert f"thread: {fork_id}" in resumed.stderr and resumed.stdout == "You said: third\n"
    shown = roder("threads", "show", fork_id, env=cli_env).stdout
    assert f"forked from {source} at sequence {at}" in shown
    assert journal_file.read_bytes() == before

    past = roder("threads", "fork", source, "--at", "999", env=cli_env, check=False)
    assert past.returncode == 2 and "past the end" in past.stderr
    assert roder("threads", "fork", "nope", env=cli_env, check=False).returncode == 1
    assert journal_file.read_bytes() == before
    listed = ids(list_json(cli_env))
    assert sorted(listed) == sorted([source, fork_id, whole])


def test_delete_refuses_without_a_terminal_unless_yes(cli_env: dict[str, str]) -> None:
    seed(cli_env, Seed("d-1"), Seed("d-2"), Seed("d-3"), Seed("keep"))
    before = tree(store_base(cli_env))
    refused = roder("threads", "delete", "d-1", env=cli_env, check=False)
    assert refused.returncode == 2
    assert refused.stderr == (
        "roder: error: refusing to delete without confirmation: not on a terminal; pass --yes\n"
    )
    missing = roder("threads", "delete", "d-1", "nope", "--yes", env=cli_env, check=False)
    assert missing.returncode == 1 and "not found: nope; nothing was deleted" in missing.stderr
    assert tree(store_base(cli_env)) == before

    deleted = roder("threads", "delete", "d-1", "d-2", "--yes", "--json", env=cli_env).stdout
    assert json.loads(deleted) == {"deleted": ["d-1", "d-2"]}
    assert roder("threads", "delete", "d-3", "-y", env=cli_env).stdout == "deleted d-3\n"
    assert ids(list_json(cli_env)) == ["keep"]


def test_delete_asks_on_a_terminal(cli_env: dict[str, str]) -> None:
    seed(cli_env, Seed("ask-1", "first"), Seed("ask-2"))
    code, out, shown = roder_on_terminal("threads", "delete", "ask-1", env=cli_env, answer="n\n")
    assert code == 0 and out == ""  # declining is an answer, not a failure
    assert "about to delete 1 thread(s)" in shown and "ask-1" in shown and "[y/N]" in shown
    assert "nothing was deleted" in shown
    assert sorted(ids(list_json(cli_env))) == ["ask-1", "ask-2"]
    code, out, shown = roder_on_terminal("threads", "delete", "ask-1", env=cli_env, answer="y\n")
    assert code == 0 and out == "deleted ask-1\n"
    assert ids(list_json(cli_env)) == ["ask-2"]


def test_prune_dry_run_changes_nothing_then_prune_deletes_only_old_threads(
    cli_env: dict[str, str],
) -> None:
    seed(
        cli_env,
        Seed("p-now", "fresh", 0),
        Seed("p-1d", None, 1),
        Seed("p-31d", "a month", 31),
        Seed("p-35d", None, 35),
        Seed("p-40d", "oldest", 40),
    )
    base = store_base(cli_env)
    journals = base / "threads"
    sizes = {p.stem: p.stat().st_size for p in journals.glob("*.jsonl")}
    before = tree(base)

    dry = json.loads(
        roder("threads", "prune", "--older-than", "30d", "--dry-run", "--json", env=cli_env).stdout
    )
    assert dry["dry_run"] is True and dry["count"] == 3 and dry["kept"] == 2
    assert [t["thread_id"] for t in dry["threads"]] == ["p-31d", "p-35d", "p-40d"]
    assert all(t["size_exact"] for t in dry["threads"])
    assert dry["bytes"] == sizes["p-31d"] + sizes["p-35d"] + sizes["p-40d"]
    human = roder("threads", "prune", "--older-than", "30d", "--dry-run", env=cli_env).stdout
    assert "would delete 3 of 5 threads" in human and "dry run: nothing was deleted" in human
    assert "p-40d" in human and "oldest" in human
    kept = json.loads(
        roder(
            "threads",
            "prune",
            "--older-than",
            "30d",
            "--keep-last",
            "3",
            "--dry-run",
            "--json",
            env=cli_env,
        ).stdout
    )
    assert [t["thread_id"] for t in kept["threads"]] == ["p-35d", "p-40d"]
    assert tree(base) == before  # byte-identical: dry runs change nothing

    pruned = json.loads(
        roder(
            "threads", "prune", "--older-than", "30d", "--keep-last", "3", "--json", env=cli_env
        ).stdout
    )
    assert pruned["dry_run"] is False
    assert [t["thread_id"] for t in pruned["threads"]] == ["p-35d", "p-40d"]
    assert pruned["bytes"] == sizes["p-35d"] + sizes["p-40d"]
    assert ids(list_json(cli_env)) == ["p-now", "p-1d", "p-31d"]
    for thread_id in ("p-now", "p-1d", "p-31d"):
        assert (journals / f"{thread_id}.jsonl").read_bytes() == before[
            f"threads/{thread_id}.jsonl"
        ]

    date = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=20)).date().isoformat()
    last = roder("threads", "prune", "--older-than", date, env=cli_env).stdout
    assert "deleted 1 of 3 threads" in last and "freed" in last
    nothing = roder("threads", "prune", "--older-than", "30d", env=cli_env).stdout
    assert nothing.startswith("nothing to prune")
    assert ids(list_json(cli_env)) == ["p-now", "p-1d"]

    for bad in (["--older-than", "30 days"], ["--older-than", "30d", "--keep-last", "-1"], []):
        result = roder("threads", "prune", *bad, env=cli_env, check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr


def test_prune_asks_on_a_terminal_and_shows_progress_there(cli_env: dict[str, str]) -> None:
    seed(cli_env, *(Seed(f"old-{n}", None, 60 + n) for n in range(5)), Seed("new"))
    code, out, shown = roder_on_terminal(
        "threads", "prune", "--older-than", "30d", env=cli_env, answer="y\n", stderr_terminal=True
    )
    assert code == 0, shown
    assert "about to delete 5 thread(s)" in shown and "[y/N]" in shown
    assert "deleting: 100%" in shown  # tqdm's bar, drawn on the terminal only
    assert "deleted 5 of 6 threads" in out
    assert ids(list_json(cli_env)) == ["new"]


def test_progress_bars_stay_off_pipes(cli_env: dict[str, str]) -> None:
    seed(cli_env, *(Seed(f"gone-{n}", None, 60) for n in range(3)))
    result = roder("threads", "prune", "--older-than", "30d", env=cli_env)
    assert result.stderr == "" and "deleted 3 of 3 threads" in result.stdout
