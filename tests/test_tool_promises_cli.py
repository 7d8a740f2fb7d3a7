"""docs/tools.md's promises tried through the ``roder`` command in real processes.

``roder plugins --json`` reports what the text form reports (a tool name two plugins
register, or two MCP servers produce); a pending approval survives a restart of ``roder
chat`` (SIGKILL) and is asked again at once, and ending the chat at the question leaves it
pending.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import REPO, roder_command
from .test_chat_tools import Terminal, tool_plugin_env

CLASHING = {
    "clash_a": """
        from roder_api import hookimpl
        from roder_api.tools import tool

        @tool
        def shared() -> str:
            '''From a.'''
            return "a"

        @tool
        def only_a() -> str:
            '''Only in a.'''
            return "a"

        @hookimpl
        def register_tools(register):
            register(shared)
            register(only_a)
    """,
    "clash_b": """
        from roder_api import hookimpl
        from roder_api.tools import tool

        @tool
        def shared() -> str:
            '''From b.'''
            return "b"

        @hookimpl
        def register_tools(register):
            register(shared)
    """,
}


def site_with(tmp_path: Path, plugins: dict[str, str]) -> Path:
    """Return a directory holding ``plugins`` as installed distributions (dist-info)."""
    site = tmp_path / "site"
    for name, source in plugins.items():
        info = site / f"roder_{name}-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: roder-{name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[roder]\n{name} = {name}_mod\n")
        (site / f"{name}_mod.py").write_text(textwrap.dedent(source))
    return site


def test_plugins_json_reports_the_tool_conflict_the_text_form_reports(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cli_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site_with(tmp_path, CLASHING)), cli_env.get("PYTHONPATH", "")) if p
    )
    cli_env["RODER_PLUGINS"] = "jsonl,scripted,clash_a,clash_b"
    run = [*roder_command(), "plugins"]
    text = subprocess.run(run, capture_output=True, text=True, env=cli_env, timeout=60)
    listed = subprocess.run(
        [*run, "--json"], capture_output=True, text=True, env=cli_env, timeout=60
    )
    assert "tool conflict: tool id 'shared' is registered twice" in text.stdout, text
    plugins = {p["name"]: p for p in json.loads(listed.stdout)}
    for name, other in (("clash_a", "clash_b"), ("clash_b", "clash_a")):
        (conflict,) = plugins[name]["tool_conflicts"]
        assert conflict["tool"] == "shared"
        assert set(conflict["sources"]) == {"plugin 'clash_a'", "plugin 'clash_b'"}
        assert f"plugin '{other}'" in conflict["message"]
    assert plugins["jsonl"]["tool_conflicts"] == []
    assert listed.returncode == text.returncode == 0  # a listing: the problem is in it


RAW_MCP_SERVER = REPO / "plugins" / "roder-mcp" / "tests" / "mcp_raw_server.py"


def test_plugins_json_reports_an_mcp_tool_name_two_servers_produce(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # `a` + `x__pid` and `a__x` + `pid` are both `a__x__pid`: neither is used, the rest is.
    home = Path(cli_env["RODER_HOME"])
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        "".join(
            f"[mcp_servers.{name}]\ncommand = {json.dumps(sys.executable)}\n"
            f"args = {json.dumps([str(RAW_MCP_SERVER), *tools])}\ntimeout_s = 20\n\n"
            for name, tools in (("a", ["x__pid", "own"]), ("a__x", ["pid"]))
        )
    )
    cli_env["RODER_PLUGINS"] = "jsonl,scripted,mcp"
    run = [*roder_command(), "plugins"]
    text = subprocess.run(run, capture_output=True, text=True, env=cli_env, timeout=120)
    listed = subprocess.run(
        [*run, "--json"], capture_output=True, text=True, env=cli_env, timeout=120
    )
    assert listed.returncode == text.returncode == 0, (text.stderr, listed.stderr)
    assert "a__x__pid" in listed.stderr  # reported where it always was
    assert "tool conflict: " in text.stdout and "a__x__pid" in text.stdout, text.stdout
    mcp = next(p for p in json.loads(listed.stdout) if p["name"] == "mcp")
    assert "a__own" in mcp["tools"] and mcp["error"] is None
    (conflict,) = mcp["tool_conflicts"]
    assert conflict["tool"] == "a__x__pid"
    first, second = conflict["sources"]
    assert "server 'a'" in first and "'x__pid'" in first, conflict
    assert "server 'a__x'" in second and "'pid'" in second, conflict
    assert "server 'a'" in conflict["message"] and "server 'a__x'" in conflict["message"]


def test_a_pending_approval_is_asked_again_at_once_after_a_kill_and_exit_leaves_it_pending(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    env = tool_plugin_env(tmp_path, cli_env)  # word_count = "ask"
    first = Terminal(env)
    try:
        first.wait_for("you>")
        first.type('call word_count {"text": "one two three"}\n')
        first.wait_for("[y/N]")
    finally:
        first.child.kill()  # SIGKILL with the question open
        first.close()

    second = Terminal(env, "-c")
    try:
        # Nothing typed yet: the resumed chat asks at once, before any prompt.
        screen = second.wait_for("[y/N]", timeout=30)
        asked = screen[screen.index("earlier messages") :]
        assert asked.count("you>") == 1  # the history's line, not a prompt
        assert 'allow word_count({"text": "one two three"})' in asked
        second.type("/exit\n")  # ends the chat at the question: nothing is decided
        second.wait_for("still waits for approval")
        assert second.close() == 0
    finally:
        if second.child.poll() is None:
            second.child.kill()
    assert "denied" not in second.seen.decode(errors="replace")

    third = Terminal(env, "-c")
    try:
        third.wait_for("[y/N]", timeout=30)  # still pending: asked again
        third.type("y\n")
        third.wait_for("word_count said: 3")
        third.wait_for("you>")
        third.type("\x04")
        assert third.close() == 0
    finally:
        if third.child.poll() is None:
            third.child.kill()

    shown = subprocess.run(
        [*roder_command(), "threads", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    (thread,) = json.loads(shown.stdout)["threads"]
    events = subprocess.run(
        [*roder_command(), "threads", "show", thread["thread_id"], "--events", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    journal = [entry.get("event", entry) for entry in json.loads(events.stdout)["events"]]
    kinds = [e["type"] for e in journal]
    assert kinds.count("tool_approval_requested") == 3  # asked by each of the three chats
    assert kinds.count("tool_approval_decided") == 1  # only by the explicit answer
    results = [e["item"] for e in journal if e.get("item", {}).get("type") == "tool_result"]
    assert [(r["result"], r["is_error"]) for r in results] == [("3", False)]


def test_ctrl_d_at_the_question_ends_the_chat_and_the_next_chat_asks_again(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    env = tool_plugin_env(tmp_path, cli_env)
    first = Terminal(env)
    try:
        first.wait_for("you>")
        first.type('call word_count {"text": "a b"}\n')
        first.wait_for("[y/N]")
        first.type("\x04")  # end of input at the question: a clean exit, nothing decided
        first.wait_for("still waits for approval")
        assert first.close() == 0
    finally:
        if first.child.poll() is None:
            first.child.kill()
    second = Terminal(env, "-c")
    try:
        second.wait_for('allow word_count({"text": "a b"})? [y/N]', timeout=30)
        second.type("n\n")  # an explicit answer decides
        second.wait_for("denied by the user")
        second.wait_for("you>")
        second.type("\x04")
        assert second.close() == 0
    finally:
        if second.child.poll() is None:
            second.child.kill()
    assert "denied" not in first.seen.decode(errors="replace")
