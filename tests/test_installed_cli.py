"""Issue 16, end to end: each item driven through the ``roder`` installed the README's way
(a fresh venv, built once per session), in subprocesses, on a pty where a terminal matters."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from .chat_server import ChatServer
from .installed_roder import Installed, Terminal, clean_env, run

# The first test builds the venv of the session (slow on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

THREAD = re.compile(r"thread: ([0-9a-f]{32})")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path / "home")


def config(env: dict[str, str], text: str) -> Path:
    home = Path(env["RODER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(text)
    return path


def thread_ids(installed: Installed, env: dict[str, str]) -> list[str]:
    listed = run(installed, "threads", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    return [t["thread_id"] for t in json.loads(listed.stdout)["threads"]]


def texts(installed: Installed, env: dict[str, str], thread_id: str) -> list[str]:
    shown = run(installed, "threads", "show", thread_id, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    return [i["text"] for t in json.loads(shown.stdout)["turns"] for i in t["items"] if "text" in i]


# --- chat for people ----------------------------------------------------------------------------


def test_a_terminal_chat_edits_lines_keeps_history_and_knows_slash_commands(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    chat = Terminal(installed_roder, "chat", env=env)
    try:
        chat.read_until("you>")
        chat.type("/help\r")
        shown = chat.read_until("/compact")
        for command in ("/help", "/exit", "/new", "/thread", "/model", "/compact"):
            assert command in shown
        chat.type("helo\x1b[Dl\r")  # a typo mended with the left arrow: "hello"
        shown = chat.read_until("You said: hello")
        # The thread's id comes (on stderr) before the first reply.
        assert shown.index("thread: ") < shown.index("You said: hello")
        first = THREAD.search(shown)
        assert first is not None
        chat.type("\x1b[A\r")  # the up arrow recalls the last line
        chat.read_until("You said: hello[\\s\\S]*You said: hello")
        chat.type("/thread\r")
        chat.read_until(f"thread: {first.group(1)}[\\s\\S]*thread: {first.group(1)}")
        chat.type("/model another-model\r")
        chat.read_until("model: another-model")
        chat.type("/compact\r")
        chat.read_until("committed native compaction")
        chat.type("/nosuch\r")
        chat.read_until("unknown command /nosuch")
        chat.type("/new\r")
        chat.read_until("new thread")
        chat.type("again\r")
        shown = chat.read_until("You said: again")
        assert len(set(THREAD.findall(shown))) == 2
        chat.type("/exit\r")
        assert chat.wait() == 0
    finally:
        chat.close()
    ids = thread_ids(installed_roder, env)
    assert len(ids) == 2 and first.group(1) in ids
    assert texts(installed_roder, env, first.group(1))[:4] == ["hello", "You said: hello"] * 2
    # The history outlives the chat: a new one recalls the last line with the up arrow.
    again = Terminal(installed_roder, "chat", "-c", env=env)
    try:
        again.read_until("you>")
        again.type("\x1b[A\r")
        again.read_until("You said: again")
        again.type("exit\r")
        assert again.wait() == 0
    finally:
        again.close()


def test_ctrl_c_and_ctrl_d_at_the_prompt_and_a_chat_that_sent_nothing_leaves_no_thread(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    for keys, code in (("\x04", 0), ("\x03", 130), ("/exit\r", 0)):
        chat = Terminal(installed_roder, "chat", env=env)
        try:
            chat.read_until("you>")
            chat.type(keys)
            assert chat.wait() == code, chat.text()
            assert "Traceback" not in chat.text()
        finally:
            chat.close()
    empty = run(installed_roder, "chat", env=env, stdin="")
    assert empty.returncode == 0 and "nothing to send" in empty.stderr
    assert thread_ids(installed_roder, env) == []


def test_piped_stdin_is_one_prompt_and_the_reply_alone_is_on_stdout(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    piped = run(installed_roder, "chat", env=env, stdin="first line\nsecond line\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "You said: first line\nsecond line\n"
    found = THREAD.search(piped.stderr)
    assert found is not None
    assert texts(installed_roder, env, found.group(1)) == [
        "first line\nsecond line",
        "You said: first line\nsecond line",
    ]
    once = run(installed_roder, "prompt", "name", "a", "prime", env=env)
    assert once.returncode == 0 and once.stdout == "You said: name a prime\n"
    stdin = run(installed_roder, "prompt", env=env, stdin="from stdin\n")
    assert stdin.stdout == "You said: from stdin\n"
    # -c continues the most recently updated thread.
    more = run(installed_roder, "prompt", "-c", "and another", env=env)
    latest = thread_ids(installed_roder, env)[0]
    assert more.returncode == 0 and f"thread: {latest}" in more.stderr
    assert texts(installed_roder, env, latest)[-1] == "You said: and another"
    assert len(thread_ids(installed_roder, env)) == 3


def test_unique_id_prefixes_work_everywhere_and_an_ambiguous_one_lists_the_matches(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    for n in range(17):  # 17 ids, 16 hex digits: two share a first character
        assert run(installed_roder, "prompt", f"thread {n}", env=env).returncode == 0
    ids = thread_ids(installed_roder, env)
    shared = next(c for c, n in Counter(i[0] for i in ids).items() if n > 1)
    ambiguous = run(installed_roder, "threads", "show", shared, env=env)
    assert ambiguous.returncode == 2
    for thread_id in ids:
        if thread_id.startswith(shared):
            assert thread_id in ambiguous.stderr
    target = ids[0]
    prefix = next(
        target[:n] for n in range(1, 33) if sum(i.startswith(target[:n]) for i in ids) == 1
    )
    for args in (
        ("threads", "show", prefix),
        ("threads", "export", prefix),
        ("replay", prefix),
        ("compact", prefix),
        ("prompt", "--thread", prefix, "more"),
    ):
        done = run(installed_roder, *args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        assert target in done.stdout + done.stderr, args
    chatted = run(installed_roder, "chat", "--thread", prefix, env=env, stdin="on the prefix\n")
    assert chatted.returncode == 0 and f"thread: {target}" in chatted.stderr
    forked = run(installed_roder, "threads", "fork", prefix, "--json", env=env)
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout)["forked_from"]["thread_id"] == target
    mistyped = run(installed_roder, "chat", "--thread", "zz", env=env, stdin="hello\n")
    assert mistyped.returncode == 1 and "'zz' was not found" in mistyped.stderr
    # The fork made an id of its own, which may share the prefix: the shortest unique one now.
    now = thread_ids(installed_roder, env)
    prefix = next(
        target[:n] for n in range(1, 33) if sum(i.startswith(target[:n]) for i in now) == 1
    )
    deleted = run(installed_roder, "threads", "delete", prefix, "--yes", env=env)
    assert deleted.returncode == 0 and f"deleted {target}" in deleted.stdout
    assert len(thread_ids(installed_roder, env)) == 17  # 17 - 1 deleted + 1 fork


def test_undecodable_input_broken_pipes_zones_paths_and_declined_questions(
    installed_roder: Installed, env: dict[str, str], tmp_path: Path
) -> None:
    bad = run(installed_roder, "chat", env=env, stdin=b"caf\xe9 \xff ok\n")
    assert bad.returncode == 0, bad.stderr
    assert "not valid UTF-8" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stdout == "You said: caf\ufffd \ufffd ok\n"
    long_text = "\n".join(f"line {n} " + "x" * 200 for n in range(2000))
    assert run(installed_roder, "chat", env=env, stdin=long_text).returncode == 0
    thread_id = thread_ids(installed_roder, env)[0]
    for command in (
        f"threads show {thread_id}",
        f"threads show {thread_id} --events",
        f"threads export {thread_id}",
        "threads list",
        f"replay {thread_id}",
    ):
        line = f"'{installed_roder.roder}' {command} | head -1; exit ${{PIPESTATUS[0]}}"
        piped = subprocess.run(
            ["bash", "-c", line],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert piped.returncode == 0, (command, piped.stderr)
        assert piped.stderr == "", (command, piped.stderr)
    listed = run(installed_roder, "threads", "list", env=env)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", listed.stdout), listed.stdout
    missing = tmp_path / "no" / "such" / "folder" / "out.md"
    export = run(installed_roder, "threads", "export", thread_id, "-o", str(missing), env=env)
    assert export.returncode == 1 and f"cannot write {missing}" in export.stderr
    assert ".out.md." not in export.stderr  # not the temporary file
    unknown = run(installed_roder, "plugins", env={**env, "RODER_PLUGINS": "nosuch,jsonl"})
    assert "nosuch" in unknown.stdout and "not installed" in unknown.stdout
    warned = run(installed_roder, "threads", "list", env={**env, "RODER_PLUGINS": "nosuch,jsonl"})
    assert "warning: plugin 'nosuch'" in warned.stderr and "not installed" in warned.stderr
    ask = Terminal(installed_roder, "threads", "delete", thread_id, env=env)
    try:
        ask.read_until(r"\[y/N\]")
        ask.type("n\r")
        assert ask.wait() == 0, ask.text()
        assert "nothing was deleted" in ask.text()
    finally:
        ask.close()
    assert thread_id in thread_ids(installed_roder, env)


def test_a_thread_in_use_is_refused_naming_who_holds_it(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    assert run(installed_roder, "prompt", "hello", env=env).returncode == 0
    thread_id = thread_ids(installed_roder, env)[0]
    holder = Terminal(installed_roder, "chat", "--thread", thread_id, env=env)
    try:
        holder.read_until("you>")
        refused = run(installed_roder, "prompt", "--thread", thread_id, "me too", env=env)
        assert refused.returncode == 1, refused.stderr
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith(f"roder: error: thread {thread_id} is in use by roder chat (pid ")
        assert refused.stderr.count("error") == 1 and refused.stdout == ""
        holder.type("/exit\r")
        assert holder.wait() == 0
    finally:
        holder.close()


# --- configuration ------------------------------------------------------------------------------


def test_a_typo_in_an_engine_table_is_reported_as_such_and_spares_its_sibling(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    path = config(
        env,
        '[engines.openai]\nmodels = ["gpt-5-mini"]\n\n'
        '[engines.openai-chat]\nbase_ur = "http://127.0.0.1:9/v1"\n',
    )
    broken = run(installed_roder, "prompt", "--engine", "openai-chat", "hi", env=env)
    assert broken.returncode == 1
    line = broken.stderr.strip().splitlines()[-1]
    assert "misconfigured" in line and "unknown" not in line.split("misconfigured")[0]
    assert f"{path}:5" in line and "base_ur" in line
    assert thread_ids(installed_roder, env) == []
    sibling = run(installed_roder, "models", "--engine", "openai", "--json", env=env)
    assert sibling.returncode == 0, sibling.stderr
    assert json.loads(sibling.stdout)[0]["default_model"] == "gpt-5-mini"
    plugins = run(installed_roder, "plugins", "--json", env=env)
    openai = next(p for p in json.loads(plugins.stdout) if p["name"] == "openai")
    assert openai["engines"] == ["openai"] and "openai-chat" in openai["misconfigured"]
    # A command that does not need the engine still works.
    assert run(installed_roder, "threads", "list", env=env).returncode == 0


def test_a_lazy_plugins_engine_with_a_wrong_table_is_reported_by_every_command_needing_it(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    # docs/plugin-hooks.md: the openai plugin is lazy (it declares its engine types), so
    # the instance `local` is found by its `type`; its wrong table is still reported.
    path = config(
        env,
        '[engines.local]\ntype = "openai-chat"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'modle = "gpt-5-mini"\n',
    )
    for words, stdin in (
        (("prompt", "--engine", "local", "hi"), ""),
        (("chat", "--engine", "local"), "hi\n"),
        (("models", "--engine", "local"), ""),
    ):
        done = run(installed_roder, *words, env=env, stdin=stdin)
        assert done.returncode == 1, (words, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert "'local' (plugin 'openai')" in line and "misconfigured" in line, line
        assert f"{path}:4" in line and "modle" in line, line
    assert thread_ids(installed_roder, env) == []  # a command that does not need it works


def test_empty_input_still_reports_an_engine_that_does_not_exist_or_is_misconfigured(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    # Nothing to send is no reason to hide a wrong command line: the engine it names is
    # looked up (and its table checked) before "nothing to send", as with a prompt.
    for words in (("chat", "--engine", "nope"), ("prompt", "--engine", "nope", "-")):
        done = run(installed_roder, *words, env=env, stdin="")
        assert done.returncode == 1, (words, done.stderr)
        assert "unknown inference engine id 'nope'" in done.stderr, done.stderr
    path = config(
        env,
        '[engines.local]\ntype = "openai-chat"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'modle = "gpt-5-mini"\n',
    )
    done = run(installed_roder, "chat", "--engine", "local", env=env, stdin="")
    assert done.returncode == 1, done.stderr
    assert f"{path}:4" in done.stderr and "modle" in done.stderr, done.stderr
    path.write_text("")
    fine = run(installed_roder, "chat", "--engine", "scripted", env=env, stdin="")
    assert fine.returncode == 0 and "nothing to send" in fine.stderr, fine.stderr
    assert thread_ids(installed_roder, env) == []


def test_debug_after_any_subcommand_adds_the_traceback_as_before_it(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    # A config file that is not TOML: every one of these commands fails on reading it.
    config(env, "this is = not toml [\n")
    for words in (
        ("threads", "list"),
        ("config", "show"),
        ("plugins",),
        ("serve",),  # a plugin's command
        ("temporal", "worker"),  # a plugin command's own sub-command
    ):
        plain = run(installed_roder, *words, env=env)
        before = run(installed_roder, "--debug", *words, env=env)
        after = run(installed_roder, *words, "--debug", env=env)
        assert plain.returncode == before.returncode == after.returncode == 1, (
            words,
            after.stderr,
        )
        assert "Traceback" not in plain.stderr, (words, plain.stderr)
        for debug in (before, after):
            assert debug.stderr.startswith("Traceback"), (words, debug.stderr)
            assert debug.stderr.splitlines()[-1] == plain.stderr.strip(), (words, debug.stderr)


def test_a_typo_in_the_store_table_is_an_error_with_file_key_and_line(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    path = config(env, '[thread_store]\nbackend = "jsonl"\ndurabilty = "none"\n')
    listed = run(installed_roder, "threads", "list", env=env)
    assert listed.returncode == 1
    assert f"{path}:3" in listed.stderr and "durabilty" in listed.stderr
    assert "misconfigured" in listed.stderr and len(listed.stderr.strip().splitlines()) == 1


def test_engine_instances_from_config_side_by_side_with_their_own_urls_and_models(
    installed_roder: Installed, env: dict[str, str]
) -> None:
    with ChatServer("ollama", ("llama3.2", "qwen3")) as ollama, ChatServer("vllm") as vllm:
        config(
            env,
            f'[engines.ollama]\ntype = "openai-chat"\nbase_url = "{ollama.url}"\n'
            'models = ["llama3.2"]\n\n'
            f'[engines.vllm]\ntype = "openai-chat"\nbase_url = "{vllm.url}"\n'
            'model = "served-model"\n',
        )
        models = run(installed_roder, "models", "--json", env=env)
        assert models.returncode == 0, models.stderr
        by_engine = {m["engine"]: m for m in json.loads(models.stdout)}
        assert by_engine["ollama"]["default_model"] == "llama3.2"
        assert [m["id"] for m in by_engine["vllm"]["models"]] == ["local-model"]
        assert by_engine["vllm"]["default_model"] == "served-model"
        a = run(installed_roder, "prompt", "--engine", "ollama", "hi", env=env)
        b = run(
            installed_roder, "prompt", "--engine", "vllm", "--system", "Be brief.", "hi", env=env
        )
        assert (a.returncode, a.stdout) == (0, "ollama says hi\n"), a.stderr
        assert (b.returncode, b.stdout) == (0, "vllm says hi\n"), b.stderr
        assert ollama.bodies[-1]["model"] == "llama3.2"
        assert vllm.bodies[-1]["model"] == "served-model"
        assert vllm.bodies[-1]["messages"][0] == {"role": "system", "content": "Be brief."}
        assert "authorization" not in json.dumps(vllm.bodies).lower()
    # The server is gone: the error names the engine and its URL.
    gone = run(installed_roder, "prompt", "--engine", "vllm", "anyone?", env=env)
    assert gone.returncode == 1
    assert f"engine 'vllm' at {vllm.url}" in gone.stderr, gone.stderr


def test_every_setting_and_environment_variable_is_documented() -> None:
    from .installed_roder import REPO

    documented = (REPO / "docs" / "configuration.md").read_text()
    for name in (
        "RODER_HOME",
        "RODER_PLUGINS",
        "RODER_DEFAULT_ENGINE",
        "RODER_DEFAULT_MODEL",
        "RODER_THREAD_STORE",
        "RODER_THREADS_PATH",
        "RODER_POSTGRES_DSN",
        "RODER_PLUGIN_IMPORT_TIMEOUT",
        "instructions",
        "temperature",
        "max_output_tokens",
        "default_engine",
        "default_model",
        "durability",
        "turn_timeout_s",
        "max_input_bytes",
        "provider_retry_max_attempts",
        "auto_compact_fraction",
        "type",
    ):
        assert re.search(rf"`(\w+\.)?{name}\b", documented), name
