"""The ``llm`` engine under the runtime: durable turns, tools run by Roder, chat on a pty."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roder_api import ExtensionRegistryBuilder
from roder_api.tools import tool
from roder_api.transcript import AssistantMessage, ToolCallRecord, ToolResultRecord, UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_llm import LlmEngine
from roder_runtime import Runtime, RuntimeConfig

calls: list[str] = []


@tool
def lookup(word: str) -> str:
    """Return what a word means."""
    calls.append(word)
    return f"{word} means ten"


def runtime(path: Path) -> Runtime:
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(LlmEngine())
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=path))
    builder.tool(lookup)
    return Runtime(builder.build(), RuntimeConfig(default_engine="llm", default_model="echo"))


@pytest.mark.anyio
async def test_a_tool_round_trip_is_journaled_and_survives_a_restart(tmp_path: Path) -> None:
    calls.clear()
    ask = json.dumps(
        {"prompt": "what is x?", "tool_calls": [{"name": "lookup", "arguments": {"word": "x"}}]}
    )
    async with runtime(tmp_path) as rt:
        thread_id = (await rt.create_thread()).thread_id
        answer = await rt.run_turn(thread_id, ask)
        assert answer is not None
        # The model's follow-up sees the result Roder's tool produced.
        assert json.loads(answer)["tool_results"][0]["output"] == "x means ten"
        assert calls == ["x"]
    async with runtime(tmp_path) as rt:  # a restart: the journal is the history
        snapshot = await rt.load_thread(thread_id)
        assert snapshot is not None
        kinds = [type(i) for i in snapshot.items]
        # llm-echo also says something in the step that calls the tool.
        assert kinds[0] is UserMessage and kinds[-1] is AssistantMessage
        assert kinds.count(ToolCallRecord) == kinds.count(ToolResultRecord) == 1
        assert kinds.index(ToolCallRecord) < kinds.index(ToolResultRecord)
        assert snapshot.metadata.usage.total_tokens > 0
        second = await rt.run_turn(thread_id, "and now?")
        assert second is not None and json.loads(second)["prompt"] == "and now?"
    assert calls == ["x"], "a tool is never run again by a later turn"


def test_roder_chat_streams_from_llm_echo_on_a_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env.update(
        RODER_HOME=str(tmp_path / "home"),
        LLM_USER_PATH=str(tmp_path / "llm-home"),
        PYTHONUNBUFFERED="1",
        TERM="dumb",
    )
    (tmp_path / "llm-home").mkdir(exist_ok=True)
    main, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "roder_runtime", "chat", "--engine", "llm", "--model", "echo"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        close_fds=True,
    )
    os.close(secondary)
    seen = b""

    def read_until(needle: bytes, timeout: float = 60) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while needle not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {needle!r} in {seen.decode(errors='replace')!r}"
            ready, _, _ = select.select([main], [], [], left)
            if ready:
                try:
                    seen += os.read(main, 65536)
                except OSError:
                    break

    try:
        read_until(b"you> ")
        os.write(main, b"hello from a terminal\r")
        read_until(b'"prompt": "hello from a terminal"')
        assert b"thread: " in seen
        os.write(main, b"/exit\r")
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main)


def test_roder_models_lists_llms_models(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env.update(RODER_HOME=str(tmp_path / "home"), LLM_USER_PATH=str(tmp_path / "llm-home"))
    (tmp_path / "llm-home").mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "roder_runtime", "models", "--engine", "llm", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    text = json.dumps(listed)
    assert '"echo"' in text and '"echo-needs-key"' in text
