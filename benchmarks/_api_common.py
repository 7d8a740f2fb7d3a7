"""What the public-API benchmark's workloads share: sizes, items, timing, the runtime, the peer."""

from __future__ import annotations

import gc
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from roder_api.extension import ExtensionRegistryBuilder
from roder_api.testing import ScriptedEngine
from roder_api.threads import ThreadStoreFactory
from roder_api.transcript import UserMessage
from roder_jsonl_thread_store import JsonlThreadStoreFactory
from roder_runtime import Runtime, RuntimeConfig
from roder_sqlite_thread_store import SqliteThreadStoreFactory

TEXT = "lorem ipsum dolor sit amet " * 13  # about 400 bytes per item as stored


@dataclass(frozen=True)
class Sizes:
    w1_items: int
    w2_tasks: int
    w2_rounds: int
    w3_items: int
    w5_threads: int
    repeats: int


FULL = Sizes(w1_items=1000, w2_tasks=50, w2_rounds=20, w3_items=50_000, w5_threads=1000, repeats=5)
QUICK = Sizes(w1_items=60, w2_tasks=50, w2_rounds=3, w3_items=1000, w5_threads=20, repeats=3)


def user_item(index: int) -> UserMessage:
    return UserMessage(f"{index} {TEXT}")


def peer_item(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"{index} {TEXT}"}


def raw_line(index: int) -> bytes:
    return orjson.dumps({"type": "user_message", "text": f"{index} {TEXT}"}) + b"\n"


def peer_available() -> bool:
    return importlib.util.find_spec("agents") is not None


async def interleaved(
    roder: Callable[[], Awaitable[float]],
    raw: Callable[[], Awaitable[float]],
    peer: Callable[[], Awaitable[float]] | None,
    repeats: int,
    extra: dict[str, Callable[[], Awaitable[float]]] | None = None,
    extra_out: dict[str, float] | None = None,
) -> tuple[float, float, float | None]:
    """Return the median seconds of Roder, raw and the peer, their rounds interleaved so
    that all three see the same disk weather (other jobs share this machine's disk).

    ``extra``: more baselines run in the same rounds; their medians go into ``extra_out``."""
    times: tuple[list[float], list[float], list[float]] = ([], [], [])
    more: dict[str, list[float]] = {name: [] for name in extra or {}}
    for _ in range(repeats):
        for func, out in ((roder, times[0]), (raw, times[1]), (peer, times[2])):
            if func is not None:
                gc.collect()
                out.append(await func())
        for name, func in (extra or {}).items():
            gc.collect()
            more[name].append(await func())
    if extra_out is not None:
        extra_out.update({name: statistics.median(values) for name, values in more.items()})
    peer_s = statistics.median(times[2]) if times[2] else None
    return statistics.median(times[0]), statistics.median(times[1]), peer_s


async def timed(func: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await func()
    return time.perf_counter() - start


DURABILITY: str | None = None
"""The JSONL durability to measure (``--durability``); None: the store's default."""


def set_durability(durability: str | None) -> None:
    """Measure ``durability`` (``--durability``) instead of the store's default."""
    global DURABILITY
    DURABILITY = durability


STORE = "jsonl"
"""The store Roder runs on (``--store``): ``jsonl`` or ``sqlite``."""


def set_store(store: str) -> None:
    """Measure Roder on ``store`` (``jsonl`` or ``sqlite``) instead of the JSONL store."""
    global STORE
    STORE = store


def jsonl_factory(base: Path) -> JsonlThreadStoreFactory:
    if DURABILITY is None:
        return JsonlThreadStoreFactory(base)
    return JsonlThreadStoreFactory(base, durability=DURABILITY)


def store_factory(base: Path, *, durability: str | None = None) -> ThreadStoreFactory:
    """Return the factory of the store measured (``--store``) at ``base``.

    ``durability`` overrides ``--durability`` (a thread written only to be read)."""
    if STORE == "sqlite":
        base.mkdir(parents=True, exist_ok=True)
        mode = durability or DURABILITY
        path = base / "threads.sqlite3"
        return (
            SqliteThreadStoreFactory(path, durability=mode)
            if mode
            else SqliteThreadStoreFactory(path)
        )
    if durability is not None:
        return JsonlThreadStoreFactory(base, durability=durability)
    return jsonl_factory(base)


@asynccontextmanager
async def runtime_at(base: Path) -> Any:
    """Yield a Runtime on a JSONL store at ``base`` (default durability unless asked)."""
    builder = ExtensionRegistryBuilder()
    builder.inference_engine(ScriptedEngine())
    builder.thread_store_factory(store_factory(base))
    async with Runtime(builder.build(), RuntimeConfig()) as runtime:
        await runtime.store()
        yield runtime


async def persist_many(runtime: Runtime, thread_id: str, items: list[UserMessage]) -> None:
    """Persist ``items`` as one batch of turn ``turn-1`` (``persist_turn_items``)."""
    await runtime.persist_turn_items(thread_id, "turn-1", items)


@contextmanager
def peer_session(session_id: str, db: Path) -> Iterator[Any]:
    from agents import SQLiteSession

    session = SQLiteSession(session_id, db)
    try:
        yield session
    finally:
        session.close()


# --- W1 / W2: durable appends -----------------------------------------------------------------
