"""``wait_for_events`` on PostgreSQL is woken by ``LISTEN/NOTIFY``, not by its recheck."""

from __future__ import annotations

import anyio
import pytest

from roder_api.testing.conformance import make_metadata, user_item
from roder_postgres_thread_store import PostgresThreadStoreFactory
from roder_postgres_thread_store import _store as store_module
from roder_postgres_thread_store._notify import channel_name

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]


async def test_a_commit_on_another_store_wakes_a_waiter_at_once(
    postgres_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the recheck at two minutes, only a notification can wake the waiter within
    seconds: the writer is another store object (no in-process wake-up), so each return
    well before the recheck is a ``LISTEN/NOTIFY`` wake-up (no tight wall-clock bound)."""
    monkeypatch.setattr(store_module, "RECHECK_S", 120.0)
    factory = PostgresThreadStoreFactory(dsn=postgres_dsn, schema=schema)
    async with await factory.open() as waiting, await factory.open() as writing:
        monkeypatch.setattr(waiting, "wait_poll_s", (120.0, 120.0))
        tid = (await writing.create_thread(make_metadata())).thread_id
        await writing.append_events(tid, [user_item("one")])
        assert await waiting.wait_for_events(tid, 1, 0.05) == 1  # starts the listener
        delays: list[float] = []
        with anyio.fail_after(100):
            for n in range(5):
                async with anyio.create_task_group() as tg:

                    async def wait(after: int = 1 + n) -> None:
                        start = anyio.current_time()
                        assert await waiting.wait_for_events(tid, after, 90) == after + 1
                        delays.append(anyio.current_time() - start)

                    tg.start_soon(wait)
                    await anyio.sleep(0.3)
                    await writing.append_events(tid, [user_item(f"n{n}")])
        assert len(delays) == 5 and max(delays) < 30.0, delays


def test_channel_names_fit_an_identifier() -> None:
    assert channel_name("roder") == "roder_events_roder"
    long = channel_name("s" * 63)
    assert len(long) <= 63 and long != channel_name("t" * 63)
