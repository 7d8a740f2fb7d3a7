"""``roder prompt`` in real subprocesses: piped stdin and TEXT together, busy threads."""

from __future__ import annotations

import json
import subprocess

import anyio
import anyio.to_thread

from ._cli_store import store_base
from .conftest import make_runtime
from .test_cli import roder


def user_texts(env: dict[str, str], thread_id: str) -> list[str]:
    shown = json.loads(roder("threads", "show", thread_id, "--json", env=env).stdout)
    return [i["text"] for t in shown["turns"] for i in t["items"] if i["type"] == "user_message"]


def test_piped_stdin_and_text_are_one_prompt_stdin_first(cli_env: dict[str, str]) -> None:
    # As llm does: what was piped, then a space, then TEXT; one prompt, one turn.
    both = roder("prompt", "Summarise", "this", env=cli_env, stdin="line one\nline two\n")
    assert both.stdout == "You said: line one\nline two\n Summarise this\n"
    thread_id = both.stderr.split("thread: ", 1)[1].split()[0]
    assert user_texts(cli_env, thread_id) == ["line one\nline two\n Summarise this"]
    # TEXT alone (nothing piped), stdin alone (no TEXT, or TEXT "-"), unchanged.
    assert roder("prompt", "only", "words", env=cli_env).stdout == "You said: only words\n"
    assert roder("prompt", env=cli_env, stdin="only stdin\n").stdout == "You said: only stdin\n"
    assert roder("prompt", "-", env=cli_env, stdin="dash\n").stdout == "You said: dash\n"
    # Blank stdin adds nothing to TEXT.
    assert roder("prompt", "x", env=cli_env, stdin="\n \n").stdout == "You said: x\n"


def test_a_busy_thread_is_refused_without_announcing_it_as_ours(cli_env: dict[str, str]) -> None:
    async def main() -> subprocess.CompletedProcess[str]:
        async with make_runtime(store_base(cli_env)) as runtime:
            thread_id = (await runtime.create_thread(title="held")).thread_id
            async with runtime.start_session(thread_id, owner="the holder"):
                return await anyio.to_thread.run_sync(
                    lambda: roder(
                        "prompt", "--thread", thread_id, "me too", env=cli_env, check=False
                    )
                )

    refused = anyio.run(main)
    assert refused.returncode == 1
    assert "is in use by the holder" in refused.stderr
    # `thread: <id>` says which thread the chat is on: this one never was.
    assert "thread: " not in refused.stderr and refused.stdout == ""
    assert refused.stderr.count("error") == 1, refused.stderr
