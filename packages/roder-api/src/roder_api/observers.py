"""Observers: code that sees every journaled event of a runtime, after it is persisted.

An :class:`Observer` is registered by a plugin (hook ``register_observers``) or a script
(``ExtensionRegistryBuilder.observer``). The runtime hands it each batch of events right
after the thread store persisted it — the very events and sequence numbers the journal
holds, never a second copy of the event path. Observing never blocks or fails a turn:
each observer has a bounded queue of its own, served in a thread and event loop of its
own; a batch that finds the queue full is dropped (counted and logged), and an exception
an observer raises is logged, never raised into the turn. Observers are closed with the
runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from roder_api.events import JournalEvent


@runtime_checkable
class Observer(Protocol):
    """Receive every batch of journaled events, in order per thread, after persistence.

    ``observe`` runs in the observers' own thread and event loop (asyncio), never on the
    loop of the turn; a slow observer only fills its own queue. ``aclose`` is called once
    when the runtime closes, after the batches already queued were handed over.
    """

    async def observe(self, thread_id: str, events: Sequence[JournalEvent]) -> None:
        """Handle one batch of events of thread ``thread_id`` (already persisted)."""
        ...

    async def aclose(self) -> None:
        """Flush and release what the observer holds (exporters, files)."""
        ...


__all__ = ["Observer"]
