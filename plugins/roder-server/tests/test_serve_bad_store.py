"""``roder serve`` with a ``[thread_store]`` it cannot use stops at start, saying why.

A store id nobody installed, a key the store does not know, a database nobody answers:
the server must not say it listens and then answer every request with 503 (or serve a
default store the user did not ask for). It exits non-zero before its listening line,
with the same one-line error ``roder threads list`` gives — with one worker and with
several (each worker opens the store; the supervisor stops after their start failures).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from serve_support import DEFAULT_TEST_DSN, PREFIX, RODER, Server, serve_until_exit

CASES = {
    "unknown-backend": ('[thread_store]\nbackend = "postgress"\n', "postgress"),
    "unknown-key": ('[thread_store]\nbackend = "sqlite"\npathh = "x.db"\n', "pathh"),
    "unreachable-database": (
        '[thread_store]\nbackend = "postgres"\ndsn = "postgresql://postgres@127.0.0.1:1/none"\n',
        "127.0.0.1",
    ),
}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_store_it_cannot_use_stops_the_server_at_start(
    tmp_path: Path, case: str, workers: int
) -> None:
    table, named = CASES[case]
    config = tmp_path / "config.toml"
    config.write_text(table)
    code, err = serve_until_exit(config, tmp_path / "home", "--workers", str(workers), timeout_s=90)
    assert code is not None, f"the server served a store it cannot use: {err}"
    assert code != 0, err
    assert PREFIX not in err, f"the server said it listens on a store it cannot use: {err}"
    assert named in err, err
    assert "Traceback" not in err, err
    # Refused once, before any worker starts: not five worker start failures.
    assert "exited before it served" not in err, err


def test_config_check_names_a_bad_server_key_with_file_and_line(tmp_path: Path) -> None:
    # `roder serve` refuses `[server] prot` itself; `roder config check` must say so too,
    # with the file and line, as it does for every other plugin's table.
    config = tmp_path / "config.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RODER_")}
    env["RODER_HOME"] = str(tmp_path / "home")

    def check(text: str) -> subprocess.CompletedProcess[str]:
        config.write_text(text)
        return subprocess.run(
            [str(RODER), "--config", str(config), "config", "check"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    result = check("[server]\nport = 8000\nprot = 8001\n")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"{config}:3" in out and "prot" in out, out
    bad_value = check('[server]\nworkers = "many"\n')
    assert bad_value.returncode == 1 and "workers" in bad_value.stdout + bad_value.stderr
    clean = check("[server]\nport = 8000\n")
    assert clean.returncode == 0, clean.stdout + clean.stderr


def test_a_store_that_stops_answering_later_makes_readyz_503_and_the_server_lives(
    serve: Callable[..., Server],
) -> None:
    # docs/serve.md: "Later outages are /readyz 503s". The PostgreSQL store's tables go
    # away under a running server (an outage it cannot mend): /readyz says 503 with
    # Retry-After, /healthz still answers, and the process keeps serving.
    import psycopg
    from psycopg import sql

    schema = f"roder_serve_{uuid.uuid4().hex[:10]}"
    server = serve("postgres", schema=schema)
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
    with psycopg.connect(DEFAULT_TEST_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    ready = httpx.get(server.url + "/readyz", timeout=30)
    assert ready.status_code == 503, ready.text
    assert ready.headers["retry-after"] == "5"
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
    assert server.proc is not None and server.proc.poll() is None
