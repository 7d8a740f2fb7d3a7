"""``roder compact``: what it committed, or why it discarded (exit status 1)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from roder_api.inference import Completed, Failed, TokenUsage, Usage
from roder_api.testing import ScriptedEngine
from roder_api.transcript import AssistantMessage, ProviderMetadata, UserMessage
from roder_runtime.cli._compact import run_compact

from ._cli_store import chat_turns
from .conftest import make_runtime, roder_command


def roder(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*roder_command(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_roder_compact_commits_and_reports(cli_env: dict[str, str]) -> None:
    thread_id = chat_turns(cli_env, "build a parser", "for JSON")

    human = roder("compact", thread_id, env=cli_env)
    assert human.returncode == 0, human.stderr
    assert f"committed native compaction of thread {thread_id}" in human.stdout
    assert "native boundary cmp_scripted_1" in human.stdout
    assert "replay history: 4 items -> 1" in human.stdout

    machine = roder("compact", thread_id, "--json", env=cli_env)
    assert machine.returncode == 0, machine.stderr
    report = json.loads(machine.stdout)
    assert report["status"] == "committed" and report["reason"] is None
    assert report["mode"] == "native" and report["attempts"] == 1
    assert report["replay_items_before"] == 1 and report["replay_items_after"] == 1
    assert report["boundary"]["type"] == "provider_metadata"
    assert set(report["usage_by_purpose"]) == {"compaction", "turn"}
    assert report["usage"]["total_tokens"] > 0

    shown = json.loads(roder("threads", "show", thread_id, "--json", env=cli_env).stdout)
    items = [i for t in shown["turns"] for i in t["items"]]
    assert [i["type"] for i in items] == [
        "user_message",
        "assistant_message",
        "user_message",
        "assistant_message",
        "provider_metadata",
        "provider_metadata",
    ]


def test_roder_compact_errors(cli_env: dict[str, str]) -> None:
    missing = roder("compact", "no-such-thread", env=cli_env)
    assert missing.returncode == 1
    assert "not found" in missing.stderr and missing.stderr.count("\n") == 1
    assert roder("compact", env=cli_env).returncode == 2
    assert "compact" in roder("--help", env=cli_env).stdout


BOUNDARY = ProviderMetadata({"output": [{"type": "compaction", "id": "cmp_x"}]})


@pytest.mark.anyio
@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
async def test_roder_compact_reports_a_discard_with_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    engine = ScriptedEngine(
        compactions=[[BOUNDARY, Usage(TokenUsage(30, 10, 40)), Failed("upstream error")]]
    )
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        await runtime.persist_turn_item(thread_id, "t1", UserMessage("hi"))
        await runtime.persist_turn_item(thread_id, "t1", AssistantMessage("hello"))
        args = argparse.Namespace(thread_id=thread_id, engine=None, model=None, json=as_json)
        assert await run_compact(runtime, args) == 1
        out = capsys.readouterr().out
        if as_json:
            report = json.loads(out)
            assert report["status"] == "discarded" and report["reason"] == "failed"
            assert report["attempts"] == 1 and report["usage"]["total_tokens"] == 40
            assert report["boundary"] is None
            assert report["replay_items_after"] == report["replay_items_before"] == 2
            assert report["usage_by_purpose"]["discarded_compaction"]["total_tokens"] == 40
        else:
            assert f"discarded compaction of thread {thread_id}: failed" in out
            assert "upstream error" in out
            assert "replay history unchanged: 2 items" in out
            assert "discarded_compaction 40" in out
        snapshot = await runtime.load_thread(thread_id)
        assert snapshot is not None
        assert snapshot.items == [UserMessage("hi"), AssistantMessage("hello")]


@pytest.mark.anyio
async def test_roder_compact_on_an_empty_thread_says_so(tmp_path: Path) -> None:
    from roder_runtime.cli._common import CommandError

    engine = ScriptedEngine(compactions=[[BOUNDARY, Completed()]])
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        args = argparse.Namespace(thread_id=thread_id, engine=None, model=None, json=False)
        with pytest.raises(CommandError, match="no history to compact"):
            await run_compact(runtime, args)
        assert engine.compaction_requests == []
