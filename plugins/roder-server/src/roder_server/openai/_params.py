"""Where a response's request parameters live: journaled with its turn's input.

What a request asked for that the transcript does not hold (the model as asked, the
instructions, the tools, ``previous_response_id``, ``background``, ``metadata``) is the
``metadata`` of the turn's first event (``TurnStarted``, or ``InputAccepted`` when the
input waits) under :data:`META_KEY`: written once, in the append that accepts the input.
Threads written before kept each response's parameters in the thread's ``extra`` under
:data:`EXTRA_KEY`; those are still read, and a deleted response is marked there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import orjson

from roder_api.events import InputAccepted
from roder_api.threads import ThreadStore
from roder_server.openai._convert import not_found
from roder_server.openai._projection import response_id

EXTRA_KEY = "openai_responses"
"""The thread ``extra`` key marking deleted responses, by turn id (and where threads written
before kept each response's parameters: JSON text or objects, still read)."""
META_KEY = "openai_response"
"""The key of a response's request parameters in its turn's ``metadata``."""
_DEFAULTS: Mapping[str, Any] = {
    "instructions": None,
    "previous_response_id": None,
    "tools": [],
    "background": False,
    "metadata": {},
}
"""Parameters left out of a kept entry when they have these values (read back as them)."""

_LOCKS = [anyio.Semaphore(1) for _ in range(64)]
"""The per-thread serialisation of the ``extra`` read-modify-writes (deletes) in this
process."""


def kept_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``params`` as journaled: their default values left out."""
    return {k: v for k, v in params.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}


async def response_params(store: ThreadStore, thread_id: str, turn_id: str) -> dict[str, Any]:
    """Return what the request of a response asked for, with ``journal_after``; 404 when
    the response was deleted or never was (its turn's first event is found by paging back
    from the journal's end; a thread written before keeps them in its ``extra``)."""
    extra = (await store.get_thread(thread_id)).extra or {}
    found = _unpacked(dict(extra.get(EXTRA_KEY) or {}).get(turn_id))
    if isinstance(found, Mapping):
        if not found.get("deleted"):
            return {**_DEFAULTS, **found}
    else:
        start = await turn_start(store, thread_id, turn_id)
        if start is not None:
            sequence, kept = start
            return {**_DEFAULTS, **kept, "journal_after": sequence - 1}
    raise not_found(f"no response {response_id(turn_id)!r}", "response_id")


async def mark_deleted(store: ThreadStore, thread_id: str, turn_id: str) -> None:
    """Mark response ``turn_id`` deleted in the thread's ``extra``."""
    # ``update_thread`` replaces ``extra`` whole: the read-modify-write is serialised per
    # thread in this process.
    async with _LOCKS[hash(thread_id) % len(_LOCKS)]:
        extra = dict((await store.get_thread(thread_id)).extra or {})
        extra[EXTRA_KEY] = {**dict(extra.get(EXTRA_KEY) or {}), turn_id: '{"deleted":true}'}
        await store.update_thread(thread_id, extra=extra)


def _unpacked(found: object) -> object:
    """Return a kept entry as a mapping (JSON text, or an object as older threads hold)."""
    if isinstance(found, str):
        try:
            return orjson.loads(found)
        except orjson.JSONDecodeError:
            return None
    return found


async def turn_start(
    store: ThreadStore, thread_id: str, turn_id: str
) -> tuple[int, Mapping[str, Any]] | None:
    """Return the sequence of turn ``turn_id``'s first event and the response parameters
    its input was journaled with (empty when it carries none), or None when the journal
    holds no event of the turn.

    The journal is paged back from its end to the turn's first event: the one carrying its
    parameters (they ride on it), else its ``InputAccepted``; a turn with neither (not a
    response of this surface) is looked for back to the journal's start.
    """
    first: int | None = None
    before: int | None = None
    while True:
        page = await store.event_page(thread_id, before=before, limit=256)
        for entry in reversed(page.events):
            event = entry.event
            if getattr(event, "turn_id", None) != turn_id:
                continue
            first = entry.sequence
            metadata = getattr(event, "metadata", None)
            found = metadata.get(META_KEY) if isinstance(metadata, Mapping) else None
            if isinstance(found, Mapping):
                return first, found
            if isinstance(event, InputAccepted) and not event.steer:
                return first, {}
        if page.next_before is None:
            return None if first is None else (first, {})
        before = page.next_before
