"""Configuration mistakes as the installed ``roder`` reports them, in real subprocesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import roder


def write_config(env: dict[str, str], text: str) -> Path:
    path = Path(env["RODER_HOME"]) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("engine", ["openai", "anthropic"])
def test_a_typo_in_a_models_table_is_one_line_naming_file_key_and_line(
    cli_env: dict[str, str], engine: str
) -> None:
    path = write_config(
        cli_env,
        f'[engines.{engine}]\nmodel = "m"\n\n[engines.{engine}.models.m]\n'
        "context_window = 9000\ntemperatur = 1\n",
    )
    for command in (["prompt", "--engine", engine, "hi"], ["models", "--engine", engine]):
        result = roder(*command, env=cli_env, check=False)
        assert result.returncode == 1, (command, result.stderr)
        assert result.stdout == ""
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert f"{engine!r} (plugin {engine!r}) is installed but misconfigured" in line
        assert f"{path}:6" in line and "models.m" in line and "'temperatur'" in line
    # Nothing else is taken down: the scripted engine still answers, no thread was left
    # behind by the refused prompt, and `roder plugins` says what is wrong.
    assert roder("prompt", "--engine", "scripted", "hi", env=cli_env).stdout == "You said: hi\n"
    listed = json.loads(roder("threads", "list", "--json", env=cli_env).stdout)
    assert len(listed["threads"]) == 1
    plugins = {p["name"]: p for p in json.loads(roder("plugins", "--json", env=cli_env).stdout)}
    assert f"{path}:6" in plugins[engine]["misconfigured"][engine]
