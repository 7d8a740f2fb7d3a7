"""Configuration: TOML, mappings, environment overrides, and errors naming file, key, line."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_api.errors import ConfigError
from roder_runtime import load_config

pytestmark = pytest.mark.core

RETRIES = "reliability.provider_retry_max_attempts"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_file_values_are_read_with_their_source(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'default_engine = "openai"\n'
        "max_input_bytes = 2048\n"
        "[thread_store]\n"
        'backend = "jsonl"\n'
        'path = "/tmp/x"\n'
        'durability = "group"\n'
        "[reliability]\n"
        "provider_retry_max_attempts = 5\n"
        "provider_retry_initial_backoff_ms = 0\n"
        "[engines.openai]\n"
        'base_url = "http://127.0.0.1:9"\n',
    )
    config = load_config(path, environ={})
    assert config.default_engine == "openai" and config.max_input_bytes == 2048
    assert config.thread_store == "jsonl"
    assert config.thread_store_settings == {"path": "/tmp/x", "durability": "group"}
    assert config.reliability.provider_retry_max_attempts == 5
    assert config.reliability.provider_retry_initial_backoff_ms == 0
    assert config.engines == {"openai": {"base_url": "http://127.0.0.1:9"}}
    assert config.sources["reliability.provider_retry_max_attempts"] == f"{path}:8"
    assert config.sources["default_model"] == "default"
    assert config.plugin_settings()["jsonl"]["durability"] == "group"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'default_model = "a"\n[thread_store]\nbackend = "postgres"\n')
    config = load_config(
        path, environ={"RODER_DEFAULT_MODEL": "b", "RODER_POSTGRES_DSN": "postgresql://x"}
    )
    assert config.default_model == "b"
    assert config.sources["default_model"] == "env RODER_DEFAULT_MODEL"
    assert config.thread_store_settings["dsn"] == "postgresql://x"


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("default_model = 'x'\nbogus = 1\n", 2, "bogus"),
        ("[reliability]\nprovider_retry_max_attempts = 'three'\n", 2, RETRIES),
        ("[reliability]\n\nprovider_retry_max_attempts = 0\n", 3, RETRIES),
        ("[reliability]\nretries = 3\n", 2, "reliability.retries"),
        ("submission_queue_capacity = -1\n", 1, "submission_queue_capacity"),
        ("[thread_store]\nbackend = 3\n", 2, "thread_store.backend"),
    ],
)
def test_bad_keys_and_values_name_file_key_and_line(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == key and info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_bad_toml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "default_model = 'x'\n[broken\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.line == 2 and "invalid TOML" in str(info.value)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml", environ={})


def test_default_file_is_optional(tmp_path: Path) -> None:
    config = load_config(None, environ={"RODER_HOME": str(tmp_path)})
    assert config.thread_store is None and config.reliability.provider_retry_max_attempts == 3


def test_mappings_are_validated_too() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        load_config({"nope": 1}, environ={})
    assert load_config({"default_engine": "x"}, environ={}).default_engine == "x"


def test_the_postgres_dsn_variable_reaches_only_the_postgres_store() -> None:
    environ = {"RODER_POSTGRES_DSN": "postgresql://db.invalid/x"}
    jsonl = load_config({"thread_store": {"backend": "jsonl"}}, environ=environ)
    assert "dsn" not in jsonl.plugin_settings()["jsonl"]
    postgres = load_config({"thread_store": {"backend": "postgres"}}, environ=environ)
    assert postgres.plugin_settings()["postgres"]["dsn"] == "postgresql://db.invalid/x"
