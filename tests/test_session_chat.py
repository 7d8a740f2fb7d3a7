"""``roder chat`` on sessions, in real subprocesses: streaming, and Ctrl-C (SIGINT) that stops
the turn, not the program."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from .conftest import roder_command


def start_chat(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*roder_command(), "chat", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def read_until(child: subprocess.Popen[bytes], needle: bytes, seen: bytearray) -> None:
    """Read the child's stdout into ``seen`` until it contains ``needle``."""
    assert child.stdout is not None
    deadline = time.monotonic() + 60
    while needle not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out waiting for {needle!r}; got {bytes(seen)!r}"
        ready, _, _ = select.select([child.stdout], [], [], remaining)
        if ready:
            chunk = os.read(child.stdout.fileno(), 65536)
            assert chunk, f"stdout closed before {needle!r}; got {bytes(seen)!r}"
            seen += chunk


def finish(child: subprocess.Popen[bytes], seen: bytearray) -> tuple[int, str, str]:
    if child.stdin is not None and child.stdin.closed:
        child.stdin = None  # communicate() would flush it
    stdout, stderr = child.communicate(timeout=60)
    seen += stdout
    return child.returncode, seen.decode(), stderr.decode()


def slow_config(tmp_path: Path, env: dict[str, str]) -> None:
    home = Path(env["RODER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[engines.scripted]\ndelta_delay_ms = 150\n")


def test_ctrl_c_interrupts_the_turn_and_the_chat_goes_on(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    slow_config(tmp_path, cli_env)
    child = start_chat(cli_env)
    assert child.stdin is not None
    seen = bytearray()
    try:
        child.stdin.write(b"one two three four five six seven eight nine ten\n")
        child.stdin.flush()
        read_until(child, b"You said: one", seen)  # the reply streams as it arrives
        child.send_signal(signal.SIGINT)
        child.stdin.write(b"bye\n")
        child.stdin.close()
        code, stdout, stderr = finish(child, seen)
    finally:
        child.kill()
        child.wait(timeout=60)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert code == 0, stderr
    assert "turn interrupted" in stderr
    lines = stdout.splitlines()
    thread_id = lines[0].split()[1]
    shown_partial = lines[1]
    assert shown_partial.startswith("You said: one") and "ten" not in shown_partial
    assert lines[2] == "You said: bye"
    shown = subprocess.run(
        [*roder_command(), "threads", "show", thread_id, "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
        check=True,
    )
    turns = json.loads(shown.stdout)["turns"]
    first = turns[0]["items"]
    # The journal holds exactly what was shown, marked as interrupted.
    assert first[1]["text"] == shown_partial and first[1]["interrupted"] is True
    assert [i["text"] for i in turns[1]["items"]] == ["bye", "You said: bye"]


def test_ctrl_c_at_the_prompt_ends_the_chat(cli_env: dict[str, str]) -> None:
    child = start_chat(cli_env)
    assert child.stdin is not None
    seen = bytearray()
    try:
        child.stdin.write(b"hello\n")
        child.stdin.flush()
        read_until(child, b"You said: hello\n", seen)
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        code, stdout, stderr = finish(child, seen)
    finally:
        child.kill()
        child.wait(timeout=60)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None and not stream.closed:
                stream.close()
    assert code == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
