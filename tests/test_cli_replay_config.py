"""``roder replay`` and ``roder config show`` in real subprocesses."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio

from roder_api.codec import from_dict
from roder_api.transcript import (
    AssistantMessage,
    ContextCompaction,
    ProviderMetadata,
    TranscriptItem,
    UserMessage,
)

from ._cli_store import store_base
from .conftest import make_runtime
from .test_cli import roder


def make_thread(env: dict[str, str], items: list[TranscriptItem]) -> str:
    """Create a thread through ``Runtime`` (in this process) holding ``items``; return its id."""

    async def main() -> str:
        async with make_runtime(store_base(env)) as runtime:
            thread_id = (await runtime.create_thread(title="replay")).thread_id
            for number, item in enumerate(items):
                await runtime.persist_turn_item(thread_id, f"turn-{number // 2}", item)
            return thread_id

    return anyio.run(main)


def test_replay_shows_what_the_next_model_call_receives(cli_env: dict[str, str]) -> None:
    before_boundary: list[TranscriptItem] = [UserMessage("old question"), AssistantMessage("old")]
    after_boundary: list[TranscriptItem] = [
        ContextCompaction("we talked about old things"),
        UserMessage("new question"),
        AssistantMessage("new answer"),
    ]
    thread_id = make_thread(cli_env, before_boundary + after_boundary)
    replay = json.loads(roder("replay", thread_id, "--json", env=cli_env).stdout)
    assert [from_dict(item) for item in replay["items"]] == after_boundary
    assert replay["from_compaction_boundary"] is True
    assert replay["history_items"] == 5
    assert replay["engine"] == "scripted" and replay["model"] == "scripted-default"
    assert replay["instructions"] is None

    human = roder("replay", thread_id, env=cli_env).stdout.splitlines()
    assert human[0] == (
        f"replay of thread {thread_id}: 3 of 5 items (from the last compaction boundary)"
    )
    assert human[2:] == [
        "[1] (compaction boundary) we talked about old things",
        "[2] you> new question",
        "[3] assistant> new answer",
    ]

    # A thread without a boundary replays whole; instructions from the config are shown.
    plain = make_thread(cli_env, [UserMessage("hi"), AssistantMessage("hello")])
    config = Path(cli_env["RODER_HOME"]) / "config.toml"
    config.write_text('instructions = "Be brief."\ndefault_model = "tiny"\n')
    shown = roder("replay", plain, env=cli_env).stdout.splitlines()
    assert shown[0].endswith("2 of 2 items (the whole history; no compaction boundary)")
    assert shown[1:] == [
        "engine: scripted, model: tiny",
        "instructions: Be brief.",
        "[1] you> hi",
        "[2] assistant> hello",
    ]

    missing = roder("replay", "nope", env=cli_env, check=False)
    assert missing.returncode == 1 and "thread 'nope' was not found" in missing.stderr


def test_replay_of_a_native_boundary_says_what_the_provider_gets_first(
    cli_env: dict[str, str],
) -> None:
    boundary = ProviderMetadata(
        {
            "output": [{"type": "compaction", "encrypted_content": "opaque"}],
            "compacted_input": [
                {"role": "user", "content": "kept 1"},
                {"type": "compaction", "encrypted_content": "opaque"},
            ],
        }
    )
    thread_id = make_thread(
        cli_env, [UserMessage("a"), AssistantMessage("b"), boundary, UserMessage("c")]
    )
    replay = json.loads(roder("replay", thread_id, "--json", env=cli_env).stdout)
    assert [from_dict(i) for i in replay["items"]] == [boundary, UserMessage("c")]
    human = roder("replay", thread_id, env=cli_env).stdout
    assert "[1] (native compaction boundary; replays 2 provider items first)" in human


def write_config(env: dict[str, str], text: str) -> Path:
    path = Path(env["RODER_HOME"]) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_config_show_says_where_every_value_came_from(cli_env: dict[str, str]) -> None:
    defaults = json.loads(roder("config", "show", "--json", env=cli_env).stdout)
    assert defaults["config_file"] is None
    assert defaults["settings"]["default_model"] == {"value": None, "source": "default"}
    assert defaults["settings"]["reliability.provider_retry_max_attempts"] == {
        "value": 3,
        "source": "default",
    }
    store_dir = store_base(cli_env)
    assert defaults["thread_store"] == f"jsonl at {store_dir} (durability group)"

    path = write_config(
        cli_env,
        """
        default_model = "gpt-5-mini"

        [thread_store]
        durability = "group"

        [reliability]
        provider_retry_max_attempts = 5

        [engines.openai]
        base_url = "https://api.example.test/v1"
        api_key_env = "OPENAI_API_KEY"
        """,
    )
    cli_env["RODER_DEFAULT_ENGINE"] = "scripted"
    cli_env["OPENAI_API_KEY"] = "sk-never-printed"
    shown = json.loads(roder("config", "show", "--json", env=cli_env).stdout)
    settings = shown["settings"]
    assert shown["config_file"] == str(path)
    assert settings["default_model"] == {"value": "gpt-5-mini", "source": f"{path}:1"}
    assert settings["thread_store.durability"] == {"value": "group", "source": f"{path}:4"}
    assert settings["reliability.provider_retry_max_attempts"] == {
        "value": 5,
        "source": f"{path}:7",
    }
    assert settings["reliability.provider_retry_initial_backoff_ms"]["source"] == "default"
    assert settings["default_engine"] == {
        "value": "scripted",
        "source": "env RODER_DEFAULT_ENGINE",
    }
    assert settings["engines.openai.api_key_env"] == {
        "value": "OPENAI_API_KEY",
        "source": f"{path}:11",
    }
    assert "durability group" in shown["thread_store"]

    human = roder("config", "show", env=cli_env).stdout
    assert human.splitlines()[0] == f"config file: {path}"
    assert any(
        line.startswith('default_model = "gpt-5-mini"') and line.endswith(f"# {path}:1")
        for line in human.splitlines()
    )
    assert any(
        line.startswith('default_engine = "scripted"')
        and line.endswith("# env RODER_DEFAULT_ENGINE")
        for line in human.splitlines()
    )
    assert "sk-never-printed" not in human


def test_config_show_masks_secrets(cli_env: dict[str, str]) -> None:
    write_config(
        cli_env,
        """
        [thread_store]
        backend = "postgres"
        dsn = "postgresql://roder:hunter2@db.example.test:5432/roder"

        [engines.local]
        base_url = "http://me:pa55word@localhost:8080/v1"
        api_key = "sk-inline-secret"
        headers = { Authorization = "Bearer tok-123", X-Trace = "on" }
        conninfo = "host=db user=roder password=s3cret dbname=roder"
        max_tokens = 512
        """,
    )
    for args in (["config", "show"], ["config", "show", "--json"]):
        out = roder(*args, env=cli_env).stdout
        for secret in ("hunter2", "pa55word", "sk-inline-secret", "tok-123", "s3cret"):
            assert secret not in out, (args, secret)
    settings = json.loads(roder("config", "show", "--json", env=cli_env).stdout)["settings"]
    assert settings["thread_store.dsn"]["value"] == (
        "postgresql://roder:********@db.example.test:5432/roder"
    )
    assert settings["engines.local.base_url"]["value"] == "http://me:********@localhost:8080/v1"
    assert settings["engines.local.api_key"]["value"] == "********"
    assert settings["engines.local.headers"]["value"] == {
        "Authorization": "********",
        "X-Trace": "on",
    }
    assert settings["engines.local.conninfo"]["value"] == (
        "host=db user=roder password=******** dbname=roder"
    )
    assert settings["engines.local.max_tokens"]["value"] == 512
    assert settings["thread_store.backend"]["value"] == "postgres"


def test_bad_configuration_is_one_line_naming_file_and_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('default_model = "x"\n[reliability\nprovider_retry_max_attempts = 2\n')
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[reliability]\nprovider_retry_max_attempts = 2\nretries = 9\n")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[reliability]\nprovider_retry_max_attempts = "three"\n')
    for path, line, words in (
        (broken, 2, "invalid TOML"),
        (unknown, 3, "reliability.retries"),
        (wrong, 2, "expected an integer"),
    ):
        for command in (["config", "show"], ["threads", "list"], ["replay", "x"]):
            result = roder("--config", str(path), *command, env=cli_env, check=False)
            assert result.returncode == 1, (path, command)
            assert len(result.stderr.splitlines()) == 1, result.stderr
            assert f"{path}:{line}" in result.stderr and words in result.stderr
    absent = roder(
        "--config", str(tmp_path / "none.toml"), "config", "show", env=cli_env, check=False
    )
    assert absent.returncode == 1 and "not found" in absent.stderr
    usage = roder("config", env=cli_env, check=False)
    assert usage.returncode == 2
