"""Roder installed the README's way into a fresh virtual environment, once per test session.

The clone is copied (the files git tracks or would track), every distribution is built as a
wheel, and the README's first set-up command runs in the copy as written. Tests then drive
the installed ``roder`` in subprocesses (and on a pseudo-terminal where a terminal matters).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Installed:
    """A clone with roder installed the README's way, and the wheels of every distribution."""

    clone: Path
    roder: Path
    python: Path
    wheels: Path
    readme_command: str
    readme_result: subprocess.CompletedProcess[str]


def readme_commands() -> list[str]:
    """Return the README's set-up commands (the lines of its ``## Set up`` bash block)."""
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", setup, re.S)
    assert block is not None, "the README's Set up section has no bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def copy_clone(target: Path) -> Path:
    """Copy the files of this repository that git tracks or would track into ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        relative = raw.decode()
        source = REPO / relative
        if not source.is_file():
            continue  # deleted in the work tree but not yet in the index
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    return target


def clean_env(home: Path) -> dict[str, str]:
    """Return an environment without RODER_* or virtualenv variables, ``RODER_HOME=home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RODER_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    env["RODER_HOME"] = str(home)
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    return env


def install(base: Path) -> Installed:
    """Build every distribution's wheel and run the README's first command in a copy."""
    clone = copy_clone(base / "clone")
    wheels = base / "wheels"
    dists = ["."] + sorted(
        f"{kind}/{p.name}"
        for kind in ("packages", "plugins")
        for p in (clone / kind).iterdir()
        if (p / "pyproject.toml").is_file()
    )
    built = subprocess.run(
        ["python3", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), *dists],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(base / "home"),
    )
    assert built.returncode == 0, built.stderr
    command = readme_commands()[0]
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=clone,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(base / "home"),
    )
    venv = clone / ".venv"
    return Installed(
        clone, venv / "bin" / "roder", venv / "bin" / "python", wheels, command, result
    )


def run(
    installed: Installed,
    *args: str,
    env: dict[str, str],
    stdin: str | bytes = "",
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``roder`` with ``args``; stdin is piped (text, or raw bytes)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    result = subprocess.run(
        [str(installed.roder), *args],
        input=data,
        capture_output=True,
        env=env,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
    )


class Terminal:
    """``roder`` on a pseudo-terminal (stdin, stdout and stderr), typed at.

    ``roder`` is the installed one, or a command (``[python, "-m", "roder_runtime"]``).
    """

    def __init__(self, roder: Installed | Sequence[str], *args: str, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        command = [str(roder.roder)] if isinstance(roder, Installed) else list(roder)
        self.process = subprocess.Popen(
            [*command, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm"},
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.output = b""

    def type(self, text: str | bytes) -> None:
        """Type ``text`` (bytes as they are: escape sequences, Ctrl keys)."""
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def read_until(self, pattern: str, timeout: float = 30) -> str:
        """Read until the screen output (escape codes removed) matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.text()
            if re.search(pattern, shown):
                return shown
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{pattern!r} not shown within {timeout} s: {shown!r}")
            ready, _, _ = select.select([self.master], [], [], min(remaining, 0.1))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    if self.process.poll() is not None and not re.search(pattern, self.text()):
                        raise AssertionError(f"exited before {pattern!r}: {self.text()!r}")
                    time.sleep(0.05)
                self.output += chunk

    def text(self) -> str:
        """Return everything shown so far, without terminal escape sequences."""
        raw = self.output.decode(errors="replace")
        raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-B]?", "", raw)
        return raw.replace("\r", "")

    def wait(self, timeout: float = 30) -> int:
        """Wait for the process to exit (reading what it shows); return its exit code."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    break
        return self.process.wait(timeout=max(deadline - time.monotonic(), 1))

    def close(self) -> None:
        """Kill the process if it still runs; close the terminal."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self.master)


def wheel_files(wheel: Path) -> Sequence[str]:
    """Return the paths inside a wheel."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()
