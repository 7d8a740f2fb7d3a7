"""``roder chat`` on sessions, on a terminal (a pty) in real subprocesses: streaming, and
Ctrl-C (SIGINT) that stops the turn, not the program."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

from .conftest import roder_command
from .installed_roder import Terminal


def slow_config(env: dict[str, str]) -> None:
    home = Path(env["RODER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[engines.scripted]\ndelta_delay_ms = 150\n")


def terminal_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PROMPT_TOOLKIT_NO_CPR": "1"}


def test_ctrl_c_interrupts_the_turn_and_the_chat_goes_on(cli_env: dict[str, str]) -> None:
    slow_config(cli_env)
    chat = Terminal(roder_command(), "chat", env=terminal_env(cli_env))
    try:
        chat.read_until("you>")
        chat.type("one two three four five six seven eight nine ten\r")
        chat.read_until("You said: one")  # the reply streams as it arrives
        chat.process.send_signal(signal.SIGINT)
        chat.read_until("turn interrupted[\\s\\S]*you>")
        chat.type("bye\r")
        chat.read_until("You said: bye")
        chat.type("/exit\r")
        code = chat.wait()
        shown = chat.text()
    finally:
        chat.close()
    assert code == 0, shown
    thread_id = re.search(r"thread: ([0-9a-f]{32})", shown)
    assert thread_id is not None, shown
    partial = re.search(r"You said: one[^\n]*", shown)
    assert partial is not None and "ten" not in partial.group(0)
    result = subprocess.run(
        [*roder_command(), "threads", "show", thread_id.group(1), "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    )
    turns = json.loads(result.stdout)["turns"]
    first = turns[0]["items"]
    # The journal holds exactly what was shown, marked as interrupted.
    assert partial.group(0).startswith(first[1]["text"]) and first[1]["interrupted"] is True
    assert len(first[1]["text"]) < len("You said: one two three four five six seven eight nine")
    assert [i["text"] for i in turns[1]["items"]] == ["bye", "You said: bye"]


def test_ctrl_c_at_the_prompt_ends_the_chat(cli_env: dict[str, str]) -> None:
    chat = Terminal(roder_command(), "chat", env=terminal_env(cli_env))
    try:
        chat.read_until("you>")
        chat.type("hello\r")
        chat.read_until("You said: hello")
        chat.read_until("You said: hello[^\n]*\n[\\s\\S]*you>")
        chat.type("\x03")  # Ctrl-C, read by the line editor as a key
        code = chat.wait()
        shown = chat.text()
    finally:
        chat.close()
    assert code == 130, shown
    assert "interrupted" in shown and "Traceback" not in shown
