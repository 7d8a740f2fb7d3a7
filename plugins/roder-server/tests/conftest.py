"""Fixtures for ``roder serve``'s tests: real servers in subprocesses, on every store."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from serve_support import DEFAULT_TEST_DSN, Server, close_sdk_clients, drop_schemas, store_table

STORES = ["jsonl", "sqlite", "postgres"]


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    """Close the SDK clients a test made (serve_support.sdk)."""
    yield
    close_sdk_clients()


def _postgres_dsn() -> str:
    dsn = os.environ.get("RODER_TEST_POSTGRES_DSN") or DEFAULT_TEST_DSN
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any reason it cannot be used: skip
        pytest.skip(f"PostgreSQL is not reachable: {str(exc).strip().splitlines()[0]}")
    return dsn


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Return a function that writes a config for a store and starts ``roder serve`` on it
    (``home``: the server's directory; ``store_home``/``schema``: another server's store)."""
    servers: list[Server] = []
    schemas: list[str] = []
    dsn: list[str] = []

    def start(
        backend: str = "jsonl",
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        extra_config: str = "",
        top: str = "",
        schema: str | None = None,
        home: Path | None = None,
        store_home: Path | None = None,
    ) -> Server:
        if backend == "postgres":
            if not dsn:
                dsn.append(_postgres_dsn())
            if schema is None:
                schema = f"roder_serve_{uuid.uuid4().hex[:10]}"
            schemas.append(schema)
        server = Server(
            home or tmp_path,
            store_table(backend, store_home or home or tmp_path, dsn[0] if dsn else "", schema),
            extra_config=extra_config,
            top=top,
            args=args,
            env=env or {},
        )
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()
    if schemas:
        drop_schemas(dsn[0], schemas)
