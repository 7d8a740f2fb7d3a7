"""The minimal engine of docs/writing-an-engine.md, with its conformance test, runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO


def test_the_minimal_engine_and_its_conformance_snippet_pass_as_written(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "writing-an-engine.md").read_text()
    section = doc.split("## 0. A minimal engine", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    test_file = tmp_path / "test_shout_engine.py"
    test_file.write_text(code.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed is not None and int(passed.group(1)) >= 5, result.stdout
    assert " failed" not in result.stdout
