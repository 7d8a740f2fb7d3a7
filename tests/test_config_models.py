"""Unknown keys inside an engine's ``models.<id>`` tables: errors naming file, key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_runtime import load_config
from roder_runtime._runtime import load_registry

pytestmark = pytest.mark.core

# Each layout TOML allows for a model's table, and the line the typo is reported on.
LAYOUTS = [
    pytest.param(
        '[engines.{e}]\nmodel = "m"\n\n[engines.{e}.models.m]\ncontext_window = 9000\n'
        "temperatur = 1\n",
        6,
        id="header",
    ),
    pytest.param(
        '[engines.{e}]\nmodel = "m"\n\n[engines.{e}.models]\nm = {{ temperatur = 1 }}\n',
        5,
        id="inline",
    ),
    pytest.param(
        '[engines.{e}]\nmodel = "m"\nmodels.m.context_window = 9000\nmodels.m.temperatur = 1\n',
        4,
        id="dotted",
    ),
    pytest.param(
        '[engines.{e}]\nmodel = "m"\nmodels = {{ m = {{ temperatur = 1 }} }}\n',
        3,
        id="one-line",
    ),
]


@pytest.mark.parametrize("engine", ["openai", "anthropic"])
@pytest.mark.parametrize(("text", "line"), LAYOUTS)
def test_a_typo_in_a_models_table_names_file_key_and_line(
    tmp_path: Path, engine: str, text: str, line: int
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text.format(e=engine))
    config = load_config(path, environ={})
    assert config.setting_source(engine, "models.m.temperatur") == f"{path}:{line}"
    registry = load_registry(config)
    assert engine not in registry.engines
    plugin, reason = registry.misconfigured[engine]
    assert plugin == engine
    assert reason.startswith(f"{path}:{line}: ")
    assert "models.m" in reason and "'temperatur'" in reason


def test_the_known_keys_of_a_models_table_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[engines.openai.models.m]\ncontext_window = 9000\nmax_output_tokens = 100\n"
        'display_name = "M"\ntemperature = 0.5\n\n'
        "[engines.anthropic.models.c]\ncontext_window = 9000\nmax_output_tokens = 100\n"
        'display_name = "C"\n'
    )
    registry = load_registry(load_config(path, environ={}))
    assert "openai" in registry.engines and "anthropic" in registry.engines
    assert not registry.misconfigured


def test_a_bad_value_in_a_models_table_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[engines.openai]\nmodel = "m"\n\n[engines.openai.models.m]\nmax_output_tokens = 0\n'
    )
    registry = load_registry(load_config(path, environ={}))
    # Asking for the engine imports its (lazy) plugin, which finds its table wrong.
    assert "openai" not in registry.engines
    _, reason = registry.misconfigured["openai"]
    assert reason.startswith(f"{path}:5: ") and "max_output_tokens" in reason


def test_a_model_table_is_located_by_its_header(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[engines.openai]\nmodel = "m"\n\n[engines.openai.models.m]\n')
    config = load_config(path, environ={})
    assert config.setting_source("openai", "models.m") == f"{path}:4"
    # A key that is not there is given the place of the nearest table that is.
    assert config.setting_source("openai", "models.m.absent") == f"{path}:4"


def test_thousands_of_dotted_levels_load_without_recursing(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[engines.openai]\nmodels.m." + "a." * 5000 + "z = 1\n")
    config = load_config(path, environ={})
    assert config.setting_source("openai", "models.m." + "a." * 5000 + "z") == f"{path}:2"
    registry = load_registry(config)
    assert "openai" not in registry.engines  # imports the lazy plugin, which refuses it
    _, reason = registry.misconfigured["openai"]
    assert reason.startswith(f"{path}:2: ") and "'a'" in reason
