"""The suite passes from a clone kept in a directory only its owner may enter (issue 21).

A developer's home is often 0700, and CI's clone may sit in one. The test that runs
readers held to the file modes used to run them as another user, who cannot even start
the interpreter there; it now runs them as this user without capabilities. This test clones
the repository into a fresh 0700 directory and runs that test file from the clone, with
the clone's own sources first on the import path.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git clone")
def test_the_read_only_tests_pass_from_a_clone_in_a_0700_directory() -> None:
    home = Path(tempfile.mkdtemp(prefix="roder-0700-"))
    try:
        os.chmod(home, 0o700)
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        clone = home / "clone"
        subprocess.run(
            ["git", "clone", "--quiet", "--local", "--no-hardlinks", str(REPO), str(clone)],
            check=True,
            timeout=120,
        )
        sources = [clone / "packages" / "roder-api" / "src", clone]
        sources += sorted(path for path in (clone / "plugins").glob("*/src") if path.is_dir())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, sources))}
        env.pop("PYTEST_ADDOPTS", None)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                "tests/test_jsonl_reads_never_write.py",
            ],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        summary = result.stdout.strip().splitlines()[-1]
        assert "passed" in summary and "skipped" not in summary, summary
        # The code that ran was the clone's, not this checkout's.
        probe = subprocess.run(
            [sys.executable, "-c", "import roder_jsonl_thread_store as m; print(m.__file__)"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert probe.stdout.strip().startswith(str(clone)), probe.stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)
