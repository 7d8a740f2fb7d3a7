"""Following a session's journal for what other processes wrote to it.

A process that cannot take a thread's lease (another holds it) still accepts input: it
journals ``InputAccepted`` without the lease (appends never need it), and approval
decisions as ``ToolApprovalDecided``. The lease holder's session, when started with
``follow_journal=True``, waits for new events with ``ThreadStore.wait_for_events`` and
answers that input in journal order, and hands a decision to the call that waits for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from roder_api.events import InputAccepted, ToolApprovalDecided

if TYPE_CHECKING:
    from roder_runtime._session import Session

_WAIT_S = 5.0
"""How long one wait for new events lasts (then it is renewed; closing ends it sooner)."""
_RETRY_S = 1.0
"""The pause after the store failed to answer, before following again."""


async def follow_journal(session: Session, after: int, scope: anyio.CancelScope) -> None:
    """Until ``scope`` is cancelled (the session closes): take what others journaled after
    sequence ``after`` — input to answer, decisions for calls that wait."""
    journal = session.journal
    with scope:
        while True:
            try:
                last = await journal.store.wait_for_events(session.thread_id, after, _WAIT_S)
                if last <= after:
                    continue
                entries = await journal.read_events(after=after)
            except Exception:  # noqa: BLE001 - a store hiccup: the turns report their own
                await anyio.sleep(_RETRY_S)
                continue
            for entry in entries:
                event = entry.event
                if isinstance(event, InputAccepted) and not event.steer:
                    session.take_journaled_input(event.turn_id, event.text)
                elif isinstance(event, ToolApprovalDecided):
                    session.take_journaled_decision(event)
                after = entry.sequence
