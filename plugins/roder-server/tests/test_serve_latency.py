"""``roder serve`` keeps blocking work off its event loop: plugins are imported at start-up.

With lazy plugins, the first lookup of an engine imports its plugin; inside ``roder serve``
that would be a blocking import on the event loop during a request. The server loads the
whole registry (``load_all``) in a worker thread before it says it is listening.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

PREFIX = "roder serve: listening on "

SPY = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from roder_api import ExtensionRegistry

    record = sys.argv[1]
    original = ExtensionRegistry.load_all

    def spy(self):
        result = original(self)
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        left = [p.name for p in self.plugins if not p.imported and not p.error]
        with open(record, "a") as out:
            out.write(json.dumps({
                "main_thread": threading.current_thread() is threading.main_thread(),
                "on_loop": on_loop,
                "not_imported": left,
            }) + "\\n")
        return result

    ExtensionRegistry.load_all = spy
    from roder_runtime.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def _spied_serve(tmp_path: Path, spy: str, record: Path, tables: str = "") -> subprocess.Popen[str]:
    """Start ``roder serve --port 0`` on a JSONL store under ``spy`` (code run before the
    command, given ``record``), with ``tables`` added to its config."""
    config = tmp_path / "config.toml"
    config.write_text(
        f'[thread_store]\nbackend = "jsonl"\npath = "{tmp_path / "threads"}"\n{tables}'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path / "home")
    args = [sys.executable, "-c", spy, str(record), "--config", str(config), "serve"]
    return subprocess.Popen(
        [*args, "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


def test_serve_loads_every_plugin_in_a_worker_thread_before_it_listens(tmp_path: Path) -> None:
    record = tmp_path / "load_all.jsonl"
    proc = _spied_serve(tmp_path, SPY, record)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the server's first line (it blocks until then)
        assert line.startswith(PREFIX), line + proc.stderr.read()
        # What was recorded before the server said it listens:
        calls = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
        off_loop = [c for c in calls if not c["main_thread"] and not c["on_loop"]]
        assert off_loop, f"load_all did not run in a worker thread before listening: {calls}"
        assert all(not c["on_loop"] for c in calls), calls
        assert off_loop[-1]["not_imported"] == []
        url = line[len(PREFIX) :].strip()
        deadline = time.monotonic() + 30
        while True:  # and it serves
            try:
                if httpx.get(url + "/v1/engines", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server never answered"
            time.sleep(0.1)
    finally:
        _stop(proc)


IMPORT_SPY = textwrap.dedent(
    """
    import asyncio, sys

    record = sys.argv[1]

    class Spy:
        # Records every Roder module imported while an event loop runs in the thread.
        def find_spec(self, name, path=None, target=None):
            if name.startswith(("roder_runtime", "roder_api", "roder_server")):
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    return None
                with open(record, "a") as out:
                    out.write(name + "\\n")
            return None

    sys.meta_path.insert(0, Spy())
    from roder_runtime.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def test_a_run_imports_no_runtime_code_on_the_event_loop(tmp_path: Path) -> None:
    # The runtime imports its session code when the first session opens: inside `roder
    # serve` that import held the event loop (tens of ms) while a burst of runs waited.
    record = tmp_path / "imports.txt"
    proc = _spied_serve(tmp_path, IMPORT_SPY, record, "[engines.scripted]\ndelta_delay_ms = 0\n")
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(PREFIX), line + proc.stderr.read()
        record.unlink(missing_ok=True)  # start-up's imports: the loop serves nothing yet
        url = line[len(PREFIX) :].strip()
        with httpx.Client(base_url=url, timeout=30) as c:
            tid = c.post("/v1/threads", json={}).json()["thread_id"]
            assert c.post(f"/v1/threads/{tid}/runs", json={"input": "hi"}).status_code == 202
            params = {"after": 0, "until": "turn_end"}
            with c.stream("GET", f"/v1/threads/{tid}/stream", params=params) as stream:
                body = b"".join(stream.iter_bytes())
        assert b"event: turn_complete" in body, body
        imported = record.read_text().split() if record.exists() else []
        assert imported == [], f"imported on the event loop during a run: {imported}"
    finally:
        _stop(proc)
