"""docs/configuration.md's promises tried through the ``roder`` command (issue 21, 16-19).

Engine instances of every engine type that exists, a wrong ``type`` named with its line and
the types there are; names that do not exist (tools, MCP keys) are errors with file:line;
``roder config check`` reports every mistake at once without running anything; store values
of the wrong kind name their key and line; ``roder models`` says the model Anthropic sends.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from .test_cli import roder
from .test_cli_config import write_config


@pytest.mark.parametrize("wrong", ["openai_chat", "openai-chatt"])
def test_a_wrong_engine_type_is_an_error_at_load_naming_line_and_the_types(
    cli_env: dict[str, str], wrong: str
) -> None:
    path = write_config(
        cli_env,
        f'[engines.local]\nbase_url = "http://127.0.0.1:1/v1"\ntype = "{wrong}"\n',
    )
    for command in (["models"], ["prompt", "--engine", "local", "hi"]):
        result = roder(*command, env=cli_env, check=False)
        assert result.returncode == 1, result
        assert f"{path}:3" in result.stderr, result.stderr
        assert repr(wrong) in result.stderr
        assert "unknown inference engine" not in result.stderr
        for existing in ("openai", "openai-chat", "anthropic"):
            assert existing in result.stderr.split(wrong, 1)[1]


def test_a_typed_table_makes_an_anthropic_engine_that_says_its_real_model(
    cli_env: dict[str, str],
) -> None:
    write_config(
        cli_env,
        textwrap.dedent(
            """
            [engines.claude]
            type = "anthropic"
            base_url = "http://127.0.0.1:1"
            model = "claude-haiku-4-5"
            models = ["claude-haiku-4-5"]
            """
        ),
    )
    listed = json.loads(roder("models", "--json", env=cli_env, check=False).stdout)
    by_engine = {entry["engine"]: entry for entry in listed}
    assert by_engine["claude"]["default_model"] == "claude-haiku-4-5"
    # Item 19: the built-in anthropic engine reports the model it sends, not a placeholder.
    assert by_engine["anthropic"]["default_model"] == "claude-sonnet-4-6"
    human = roder("models", "--engine", "anthropic", env=cli_env, check=False).stdout
    assert "anthropic  (default model: claude-sonnet-4-6)" in human
    assert "anthropic-default" not in human


def test_roder_models_reports_the_model_anthropic_sends(cli_env: dict[str, str]) -> None:
    write_config(cli_env, '[engines.anthropic]\nbase_url = "http://127.0.0.1:1"\n')
    listed = json.loads(roder("models", "--json", env=cli_env, check=False).stdout)
    by_engine = {entry["engine"]: entry for entry in listed}
    assert by_engine["anthropic"]["default_model"] == "claude-sonnet-4-6"


TOOL_MISTAKES = """\
[tools]
enabled = ["reverse_txt"]

[tools.approval]
reverse_txt = "deny"

[mcp_servers.files]
comand = "python"
"""


def test_names_that_do_not_exist_are_errors_with_file_and_line(
    cli_env: dict[str, str],
) -> None:
    path = write_config(cli_env, TOOL_MISTAKES)
    result = roder("prompt", "hi", env=cli_env, check=False)
    assert result.returncode == 1
    assert f"{path}:" in result.stderr and "reverse_txt" in result.stderr, result.stderr
    assert result.stdout == ""
    for text, line in (
        ('[tools]\nenabled = ["reverse_txt"]\n', 2),
        ('[tools.approval]\nreverse_txt = "deny"\n', 2),
        ('\n[mcp_servers.files]\ncomand = "python"\n', 3),
    ):
        path.write_text(text)
        result = roder("prompt", "hi", env=cli_env, check=False)
        assert result.returncode == 1, (text, result)
        assert f"{path}:{line}" in result.stderr, (text, result.stderr)


def test_config_check_reports_every_mistake_at_once_and_runs_nothing(
    cli_env: dict[str, str], tmp_path: object
) -> None:
    marker = f"{cli_env['RODER_HOME']}/started"
    text = TOOL_MISTAKES + textwrap.dedent(
        f"""
        [mcp_servers.real]
        command = "{sys.executable}"
        args = ["-c", "open({marker!r}, 'w').write('x')"]

        [engines.local]
        type = "openai_chat"

        [engines.openai]
        temperatur = 1

        [thread_store]
        durabilty = "fsync"

        [reliability]
        provider_retry_max_attempts = 0
        """
    )
    path = write_config(cli_env, text)
    result = roder("config", "check", env=cli_env, check=False)
    assert result.returncode == 1, result
    out = result.stdout + result.stderr
    lines = text.splitlines()

    def line_of(fragment: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if line.startswith(fragment))

    for fragment in (
        "enabled =",
        "reverse_txt =",
        "comand =",
        'type = "openai_chat"',
        "temperatur",
        "durabilty",
        "provider_retry_max_attempts",
    ):
        assert f"{path}:{line_of(fragment)}" in out, (fragment, out)
    import os

    assert not os.path.exists(marker), "config check started an MCP server"
    path.write_text('[engines.claude]\ntype = "anthropic"\n')
    clean = roder("config", "check", env=cli_env)
    assert clean.returncode == 0 and "no mistakes" in clean.stdout


@pytest.mark.parametrize(
    ("backend", "key", "value"),
    [
        ("sqlite", "busy_timeout_s", '"soon"'),
        ("postgres", "max_size", '"many"'),
        ("postgres", "min_size", '"few"'),
        ("postgres", "connect_timeout_s", '"later"'),
    ],
)
def test_store_values_of_the_wrong_kind_name_key_and_line(
    cli_env: dict[str, str], backend: str, key: str, value: str
) -> None:
    extra = 'dsn = "postgresql://postgres@127.0.0.1:1/test"\n' if backend == "postgres" else ""
    path = write_config(cli_env, f'[thread_store]\nbackend = "{backend}"\n{extra}{key} = {value}\n')
    result = roder("threads", "list", env=cli_env, check=False)
    assert result.returncode == 1, result
    line = 4 if extra else 3
    assert f"{path}:{line}" in result.stderr and key in result.stderr, result.stderr
    assert "could not convert" not in result.stderr


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_store_path_that_is_not_a_string_is_refused(
    cli_env: dict[str, str], backend: str, tmp_path: object
) -> None:
    import os

    path = write_config(cli_env, f'[thread_store]\nbackend = "{backend}"\npath = 3\n')
    cwd = f"{cli_env['RODER_HOME']}/cwd"
    os.makedirs(cwd)
    result = roder("threads", "list", env=cli_env, check=False, cwd=cwd)
    assert result.returncode == 1, result
    assert f"{path}:3" in result.stderr and "path" in result.stderr, result.stderr
    assert os.listdir(cwd) == []
