"""The ``roder`` command in real subprocesses on a real store."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from .conftest import roder_command


def roder(
    *args: str,
    env: dict[str, str],
    stdin: str = "",
    check: bool = True,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*roder_command(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"roder {args} failed ({result.returncode}): {result.stderr}")
    return result


@pytest.mark.core  # the fast loop: scripts/test --quick
def test_plugins_lists_the_builtins_with_versions(cli_env: dict[str, str]) -> None:
    listed = json.loads(roder("plugins", "--json", env=cli_env).stdout)
    by_name = {p["name"]: p for p in listed}
    assert by_name["jsonl"]["thread_stores"] == ["jsonl"]
    assert by_name["scripted"]["engines"] == ["scripted"]
    for plugin in listed:
        assert set(plugin) >= {"name", "version", "engines", "thread_stores", "error"}
        assert plugin["version"] and plugin["error"] is None
    human = roder("plugins", env=cli_env).stdout
    assert "jsonl 0.1.0" in human and "engines: scripted" in human


def test_empty_roder_plugins_lists_none(cli_env: dict[str, str]) -> None:
    cli_env["RODER_PLUGINS"] = ""
    assert json.loads(roder("plugins", "--json", env=cli_env).stdout) == []


def test_a_plugin_that_fails_to_import_is_reported_and_others_load(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    site = tmp_path / "site"
    dist = site / "roder_broken-0.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: roder-broken\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text("[roder]\nbroken = roder_broken_mod\n")
    (site / "roder_broken_mod.py").write_text("import a_module_that_does_not_exist\n")
    cli_env["PYTHONPATH"] = str(site)
    listed = {p["name"]: p for p in json.loads(roder("plugins", "--json", env=cli_env).stdout)}
    assert "ModuleNotFoundError" in listed["broken"]["error"]
    assert "a_module_that_does_not_exist" in listed["broken"]["error"]
    assert listed["broken"]["version"] == "0.3"
    assert listed["jsonl"]["error"] is None and listed["scripted"]["error"] is None
    human = roder("plugins", env=cli_env).stdout
    assert "broken 0.3  FAILED: ModuleNotFoundError" in human


@pytest.mark.core  # the fast loop: scripts/test --quick
def test_chat_is_durable_across_processes(cli_env: dict[str, str]) -> None:
    first = roder("chat", env=cli_env, stdin="hello there\n")
    assert "using the 'scripted' engine" in first.stderr
    # The reply alone on stdout; the thread id (and every note) on stderr.
    assert first.stdout == "You said: hello there\n"
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    second = roder("chat", "--thread", thread_id[:8], env=cli_env, stdin="one\n")
    assert f"thread: {thread_id}" in second.stderr and second.stdout == "You said: one\n"
    third = roder("prompt", "-c", "two", env=cli_env)
    assert third.stdout == "You said: two\n"
    shown = json.loads(roder("threads", "show", thread_id, "--json", env=cli_env).stdout)
    texts = [i["text"] for t in shown["turns"] for i in t["items"]]
    assert texts == [
        "hello there",
        "You said: hello there",
        "one",
        "You said: one",
        "two",
        "You said: two",
    ]
    listed = json.loads(roder("threads", "list", "--json", env=cli_env).stdout)
    assert [t["thread_id"] for t in listed["threads"]] == [thread_id]
    human = roder("threads", "show", thread_id, env=cli_env).stdout
    assert "you> two" in human and "assistant> You said: two" in human


@pytest.mark.core  # the fast loop: scripts/test --quick
def test_errors_are_one_line_with_meaningful_exit_codes(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    missing = roder("threads", "show", "nope", env=cli_env, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("roder: error: thread 'nope' was not found")
    assert "Traceback" not in missing.stderr
    usage = roder("threads", "frobnicate", env=cli_env, check=False)
    assert usage.returncode == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("default_model = 'x'\nnot_a_key = 1\n")
    config_error = roder("--config", str(bad), "threads", "list", env=cli_env, check=False)
    assert config_error.returncode == 1
    assert f"{bad}:2" in config_error.stderr and "not_a_key" in config_error.stderr
    unknown_engine = roder("chat", "--engine", "nope", env=cli_env, stdin="x\n", check=False)
    assert unknown_engine.returncode == 1 and "'scripted'" in unknown_engine.stderr


@pytest.mark.core  # the fast loop: scripts/test --quick
def test_version_flag(cli_env: dict[str, str]) -> None:
    assert roder("--version", env=cli_env).stdout.strip() == "roder 0.1.0"


def test_config_selects_store_path(cli_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "home" / "config.toml"
    config.parent.mkdir(parents=True)
    store = tmp_path / "elsewhere"
    config.write_text(
        textwrap.dedent(
            f"""
            [thread_store]
            backend = "jsonl"
            path = "{store}"
            """
        )
    )
    out = roder("chat", env=cli_env, stdin="hi\n").stderr
    thread_id = out.split("thread: ", 1)[1].split()[0]
    assert list((store / "threads").glob(f"{thread_id}*"))
