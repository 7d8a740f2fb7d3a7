"""The README's definitive example is the quickstart script, and its output is real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO


def test_readme_example_is_the_quickstart_and_prints_what_it_shows(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    script = (REPO / "examples" / "quickstart.py").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    assert code is not None and code.group(1) == script
    assert len(script.splitlines()) <= 30
    shown = re.search(r"```console\n\$ python examples/quickstart.py\n(.*?)```", readme, re.S)
    assert shown is not None
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown.group(1)


def test_readme_has_exactly_two_setup_commands() -> None:
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("##", 1)[0]
    block = re.search(r"```bash\n(.*?)```", setup, re.S)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line and not line.startswith("#")]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install ./packages/*/ . ./plugins/*/"
        " && .venv/bin/roder chat",
        "scripts/test",
    ]
    assert "scripts/test" in (REPO / ".ci" / "run").read_text()


def test_each_plugin_readme_gives_the_one_command_that_installs_it_next_to_roder() -> None:
    jsonl = "./plugins/roder-jsonl-thread-store"
    bundled = {p.parent.name for p in (REPO / "plugins").glob("*/pyproject.toml")}
    for project in sorted((REPO / "plugins").glob("*/pyproject.toml")):
        plugin = project.parent
        # A plugin built on another bundled plugin (roder-temporal on roder-server) installs
        # that one from the clone too: no package index has it either.
        needs = [
            name
            for name in sorted(bundled - {plugin.name, "roder-jsonl-thread-store"})
            if re.search(rf'"{name}[\s<>=!~\[";]', project.read_text())
        ]
        extra = "".join(f" ./plugins/{name}" for name in [*needs, plugin.name])
        if plugin.name == "roder-jsonl-thread-store":
            extra = ""
        readme = (plugin / "README.md").read_text()
        command = f"pip install ./packages/roder-api . {jsonl}{extra}"
        assert command + "\n" in readme, f"{plugin.name}/README.md must give `{command}`"
        assert f"pip install {plugin.name}" not in readme, "no package index has it"
