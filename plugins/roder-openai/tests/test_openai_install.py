"""roder-openai built and installed into a fresh environment is found by ``roder plugins``."""

from __future__ import annotations

from pathlib import Path

import pytest

from roder_api.testing.loopback import plugins_in_fresh_venv

# A pip install into a fresh venv can outlast the default per-test timeout on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PLUGIN = Path(__file__).resolve().parent.parent
REPO = PLUGIN.parent.parent


def test_the_plugin_installs_into_a_fresh_environment(tmp_path: Path) -> None:
    plugins = plugins_in_fresh_venv(
        tmp_path,
        REPO / "packages" / "roder-api",
        REPO,
        REPO / "plugins" / "roder-jsonl-thread-store",
        PLUGIN,
    )
    assert plugins["openai"]["engines"] == ["openai", "openai-chat"]
    assert plugins["openai"]["version"] == "0.1.0" and plugins["openai"]["error"] is None
