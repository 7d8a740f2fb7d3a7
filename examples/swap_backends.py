"""The same agent code on JSONL, SQLite and PostgreSQL, changed only by configuration.

Usage: python examples/swap_backends.py [DIRECTORY] [POSTGRES_SCHEMA]
PostgreSQL runs when RODER_POSTGRES_DSN is set (in POSTGRES_SCHEMA, default roder_example).
"""

import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio

from roder_runtime import Runtime


async def agent(runtime: Runtime) -> str:
    """The agent: a short chat, then a restart-proof read. It never names a backend."""
    thread_id = (await runtime.create_thread(title="swap backends")).thread_id
    for text in ("Hello!", "Which store am I on?"):
        await runtime.run_turn(thread_id, text)
    snapshot = await runtime.load_thread(thread_id)
    assert snapshot is not None
    return f"{len(snapshot.items)} items, {snapshot.metadata.usage.total_tokens} tokens"


def configurations(base: str, schema: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield each backend's configuration: the only thing that changes."""
    yield "jsonl", {"thread_store": {"backend": "jsonl", "path": f"{base}/threads"}}
    yield "sqlite", {"thread_store": {"backend": "sqlite", "path": f"{base}/threads.db"}}
    dsn = os.environ.get("RODER_POSTGRES_DSN")
    if dsn:
        yield "postgres", {"thread_store": {"backend": "postgres", "dsn": dsn, "schema": schema}}
    else:
        print("postgres: skipped (set RODER_POSTGRES_DSN to include it)")


async def main(base: str, schema: str) -> None:
    for name, config in configurations(base, schema):
        async with Runtime.from_config(config) as runtime:
            print(f"{name}: {await agent(runtime)}")
        async with Runtime.from_config(config) as runtime:  # a restart, same config
            listed = await runtime.list_threads()
            print(f"{name} after a restart: {len(listed.threads)} thread(s)")


if __name__ == "__main__":
    args = sys.argv[1:]
    directory = args[0] if args else tempfile.mkdtemp()
    anyio.run(main, directory, args[1] if len(args) > 1 else "roder_example")
