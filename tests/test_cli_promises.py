"""docs/cli.md's and getting-started.md's promises tried through ``roder`` (issue 21, 20-21)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import roder_command
from .test_cli import roder


@contextmanager
def serve_status(status: int, body: bytes) -> Iterator[str]:
    """Yield the base URL of a loopback server that answers every request with ``status``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_chat_with_stdout_in_a_file_keeps_only_what_the_model_said(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    answers = tmp_path / "answers.txt"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with answers.open("wb") as out:
        child = subprocess.Popen(
            [*roder_command(), "chat"], stdin=slave, stdout=out, stderr=slave, env=cli_env
        )
    os.close(slave)
    seen = b""

    def wait_for(needle: bytes, after: int) -> int:
        nonlocal seen
        deadline = time.monotonic() + 60
        while needle not in seen[after:]:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {needle!r}; screen: {seen!r}"
            ready, _, _ = select.select([master], [], [], remaining)
            if ready:
                chunk = os.read(master, 65536)
                assert chunk, seen
                seen += chunk
        return seen.index(needle, after) + len(needle)

    try:
        pos = wait_for(b"you>", 0)
        os.write(master, b"first line\n")
        pos = wait_for(b"you>", pos)
        os.write(master, b"second\n")
        wait_for(b"you>", pos)
        # Ctrl-D counts only at a prompt: one typed while the turn still runs reaches the
        # terminal in canonical mode, whose line discipline takes it as end-of-file for a
        # read nobody makes, and it is gone (as in any terminal program). A "you>" on the
        # screen may be the accepted line redrawn, not the next prompt, so wait for the
        # answer, then press Ctrl-D until the chat ends.
        deadline = time.monotonic() + 60
        while b"You said: second\n" not in answers.read_bytes():
            assert time.monotonic() < deadline, answers.read_bytes()
            if select.select([master], [], [], 0.05)[0]:
                seen += os.read(master, 65536)
        while True:
            os.write(master, b"\x04")
            try:
                assert child.wait(3) == 0
                break
            except subprocess.TimeoutExpired:
                assert time.monotonic() < deadline, f"Ctrl-D did not end the chat: {seen!r}"
                while select.select([master], [], [], 0)[0]:
                    seen += os.read(master, 65536)
    finally:
        os.close(master)
        if child.poll() is None:  # a wait that timed out: leave no process behind
            child.kill()
            child.wait(10)
    data = answers.read_bytes()
    assert data == b"You said: first line\nYou said: second\n", data


@pytest.mark.parametrize("flag", ["--debug", "--config"])
def test_global_flags_are_taken_after_the_subcommand(
    cli_env: dict[str, str], tmp_path: Path, flag: str
) -> None:
    first = roder("prompt", "hello", env=cli_env)
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    config = tmp_path / "other.toml"
    config.write_text("max_input_bytes = 10\n")
    args = [flag] if flag == "--debug" else [flag, str(config)]
    shown = roder("threads", "show", thread_id, "--json", *args, env=cli_env)
    assert json.loads(shown.stdout)["metadata"]["thread_id"] == thread_id
    if flag == "--config":
        refused = roder("prompt", "more than ten bytes", *args, env=cli_env, check=False)
        assert refused.returncode != 0 and "10" in refused.stderr, refused.stderr


def test_refused_input_leaves_no_thread_behind(cli_env: dict[str, str], tmp_path: Path) -> None:
    config = Path(cli_env["RODER_HOME"]) / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("max_input_bytes = 10\n")
    refused = roder("prompt", "this is more than ten bytes", env=cli_env, check=False)
    assert refused.returncode != 0, refused
    listed = json.loads(roder("threads", "list", "--json", env=cli_env).stdout)
    assert listed["threads"] == [], listed


def test_an_auth_failure_leaves_no_thread_behind(cli_env: dict[str, str]) -> None:
    with serve_status(401, b'{"error": {"message": "bad key"}}') as url:
        config = Path(cli_env["RODER_HOME"]) / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(
            f'default_engine = "local"\n[engines.local]\ntype = "openai-chat"\n'
            f'base_url = "{url}"\nmodel = "m"\napi_key_env = "LOCAL_KEY"\n'
        )
        cli_env["LOCAL_KEY"] = "wrong"
        failed = roder("prompt", "hello", env=cli_env, check=False)
    assert failed.returncode != 0, failed
    listed = json.loads(roder("threads", "list", "--json", env=cli_env).stdout)
    assert listed["threads"] == [], listed


def test_a_404_names_the_engine_and_url(cli_env: dict[str, str]) -> None:
    with serve_status(404, b"404 page not found") as url:
        config = Path(cli_env["RODER_HOME"]) / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(
            f'default_engine = "local"\n[engines.local]\ntype = "openai-chat"\n'
            f'base_url = "{url}"\nmodel = "m"\n'
        )
        failed = roder("prompt", "hello", env=cli_env, check=False)
    assert failed.returncode != 0, failed
    assert f"engine 'local' at {url}" in failed.stderr, failed.stderr


def test_times_say_utc_once_in_exports_and_prune(cli_env: dict[str, str]) -> None:
    first = roder("prompt", "hello", env=cli_env)
    thread_id = first.stderr.split("thread: ", 1)[1].split()[0]
    exported = roder("threads", "export", thread_id, "--format", "markdown", env=cli_env).stdout
    assert "- created: " in exported and " UTC" in exported
    pruned = roder("threads", "prune", "--older-than", "1s", "--dry-run", env=cli_env).stdout
    nothing = roder("threads", "prune", "--older-than", "30d", "--dry-run", env=cli_env).stdout
    for text in (exported, pruned, nothing):
        assert "UTC UTC" not in text, text
        assert "UTC)" in text or "UTC" in text


def test_agent_with_tools_exits_1_with_the_reason_at_max_tool_steps(tmp_path: Path) -> None:
    import sys

    script = str(Path(__file__).resolve().parent.parent / "examples" / "agent_with_tools.py")
    result = subprocess.run(
        [sys.executable, script, "--threads", str(tmp_path / "t"), "--max-tool-steps", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result
    assert "max_tool_steps" in result.stderr, result.stderr
    assert "assistant: None" not in result.stdout


def test_threads_list_shows_each_threads_first_prompt(cli_env: dict[str, str]) -> None:
    roder("prompt", "what is the capital of France?", env=cli_env)
    roder("chat", env=cli_env, stdin="tell me a joke\n")
    human = roder("threads", "list", env=cli_env).stdout
    assert "'what is the capital of France?'" in human and "'tell me a joke'" in human, human
    listed = json.loads(roder("threads", "list", "--json", env=cli_env).stdout)["threads"]
    prompts = [meta["extra"]["first_prompt"] for meta in listed]
    assert prompts == ["tell me a joke", "what is the capital of France?"]
