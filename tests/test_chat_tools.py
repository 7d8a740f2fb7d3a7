"""``roder chat`` with tools, on a real pseudo-terminal: it asks y/n before a call that
needs approval, and the answer decides whether the tool runs."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

from .conftest import REPO, roder_command


def tool_plugin_env(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """Return ``env`` with the example tool plugin discoverable (a dist-info on the path)."""
    site = tmp_path / "site"
    info = site / "roder_word_tools-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-word-tools\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[roder]\nword-tools = roder_word_tools\n")
    source = REPO / "examples" / "roder-word-tools" / "src"
    paths = [str(site), str(source), env.get("PYTHONPATH", "")]
    home = Path(env["RODER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[tools.approval]\nword_count = "ask"\n')
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "RODER_PLUGINS": "jsonl,scripted,word-tools",
    }


class Terminal:
    """A child on a pseudo-terminal: write keys, read what the screen shows."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.master, slave = pty.openpty()
        # A real terminal has a size (the line editor draws on it).
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.child = subprocess.Popen(
            [*roder_command(), "chat", *args], stdin=slave, stdout=slave, stderr=slave, env=env
        )
        os.close(slave)
        self.seen = b""
        self.pos = 0

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, needle: str, timeout: float = 60) -> str:
        """Wait until ``needle`` shows after what was waited for before; return the screen."""
        deadline = time.monotonic() + timeout
        while needle.encode() not in self.seen[self.pos :]:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {needle!r}; screen: {self.seen!r}"
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                assert chunk, f"the terminal closed before {needle!r}; screen: {self.seen!r}"
                self.seen += chunk
        self.pos = self.seen.index(needle.encode(), self.pos) + len(needle)
        return self.seen.decode(errors="replace")

    def close(self) -> int:
        try:
            return self.child.wait(60)
        finally:
            os.close(self.master)


def test_chat_asks_before_a_tool_call_and_follows_the_answer(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    term = Terminal(tool_plugin_env(tmp_path, cli_env))
    try:
        term.wait_for("you>")
        term.type('call word_count {"text": "one two three"}\n')
        term.wait_for("allow word_count")
        term.wait_for("[y/N]")
        term.type("y\n")
        term.wait_for("word_count said: 3")
        term.type('call word_count {"text": "four five"}\n')
        screen = term.wait_for("[y/N]")
        assert 'allow word_count({"text": "four five"})? [y/N]' in screen
        term.type("n\n")
        screen = term.wait_for("denied by the user")
        term.wait_for("you>")
        term.type("\x04")  # end of input: the chat ends
        assert term.close() == 0
    finally:
        if term.child.poll() is None:
            term.child.kill()
    assert "tool call word_count" in screen
    assert "word_count said: 2" not in screen  # the denied call never ran


def test_without_a_terminal_a_call_that_needs_approval_is_denied(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    done = subprocess.run(
        [*roder_command(), "prompt", 'call word_count {"text": "a b"}'],
        stdin=subprocess.DEVNULL,  # not a terminal, and nothing piped to add to the prompt
        capture_output=True,
        text=True,
        env=tool_plugin_env(tmp_path, cli_env),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "roder: denied" in done.stderr
    assert "no terminal to ask for approval" in done.stdout
