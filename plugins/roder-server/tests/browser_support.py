"""The thread browser under test: Debian's chromium driven by Playwright, a tool plugin
that needs approval, and a free port that survives a server restart."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
APPROVAL_CONFIG = '[tools.approval]\nword_count = "ask"\n'
"""Config that makes ``word_count`` (examples/roder-word-tools) ask before it runs."""


def chromium_path() -> str:
    """Return the system chromium, or skip the test saying what is missing."""
    try:
        import playwright.sync_api  # noqa: F401 - only whether it is there
    except ImportError:
        pytest.skip("playwright is not installed (the test extra has it)")
    found = os.environ.get("RODER_TEST_CHROMIUM") or shutil.which("chromium")
    if not found:
        pytest.skip("no chromium on PATH (scripts/install-browser installs Debian's)")
    return found


def launch() -> Iterator[Any]:
    """Yield a headless chromium browser (the system's: never ``playwright install``)."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def tool_plugin_env(site: Path) -> dict[str, str]:
    """Return the environment that makes ``roder`` find the example word-tools plugin (a
    dist-info on ``PYTHONPATH``; every installed plugin still loads)."""
    info = site / "roder_word_tools-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-word-tools\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[roder]\nword-tools = roder_word_tools\n")
    source = REPO / "examples" / "roder-word-tools" / "src"
    paths = [str(site), str(source), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def free_port() -> int:
    """Return a port nothing listens on now (for a server restarted on the same port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def transcript(page: Any) -> list[tuple[str, str]]:
    """Return what the transcript shows: (class, text) of each entry, in order."""
    rows = page.eval_on_selector_all(
        "#transcript > *", "nodes => nodes.map(n => [n.className, n.innerText])"
    )
    return [(str(c), str(t)) for c, t in rows]


def page_state(page: Any) -> dict[str, Any]:
    """Return the open thread's stream state (``window.roderBrowser.state``)."""
    state = page.evaluate("window.roderBrowser.state")
    assert state is not None, "no thread is open"
    return dict(state)
