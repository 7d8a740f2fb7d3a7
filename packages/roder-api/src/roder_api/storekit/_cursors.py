"""Listing cursors and pages: the keyset order every store lists threads in.

Listings are newest update first, ties by thread id descending (:func:`listing_key`). A
cursor is the opaque key of the last thread of a page; the next page holds the threads
whose key is below it, so a thread never appears twice while a client pages.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import orjson

from roder_api._thread_contract import EventPage, ThreadMetadata, ThreadPage
from roder_api.events import JournalEvent


def encode_cursor(updated_at_ms: int, thread_id: str) -> str:
    """Return an opaque listing cursor for the position after ``(updated_at_ms, thread_id)``."""
    raw = orjson.dumps([updated_at_ms, thread_id])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """Return the ``(updated_at_ms, thread_id)`` of a cursor; raise ``ValueError`` if bad."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        updated, thread_id = orjson.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(updated, int) or not isinstance(thread_id, str):
            raise ValueError
    except Exception:
        raise ValueError(f"invalid thread listing cursor {cursor!r}") from None
    return updated, thread_id


def listing_key(metadata: ThreadMetadata) -> tuple[int, str]:
    """Return the sort key of listings: newest update first, then thread id descending."""
    return (metadata.updated_at_ms, metadata.thread_id)


def thread_page(candidates: Sequence[ThreadMetadata], limit: int) -> ThreadPage:
    """Return the page of ``candidates`` (in listing order, up to ``limit + 1`` of them).

    Fetch one thread more than ``limit``: when it is there, the page gets a next cursor.
    """
    page = tuple(candidates[:limit])
    more = len(candidates) > limit
    return ThreadPage(page, encode_cursor(*listing_key(page[-1])) if more else None)


def event_page(events: Sequence[JournalEvent], before: int) -> EventPage:
    """Return the page of ``events`` (ascending, all below ``before``) with ``next_before``."""
    first = events[0].sequence if events else before
    return EventPage(tuple(events), first if first > 1 else None)


__all__ = ["decode_cursor", "encode_cursor", "event_page", "listing_key", "thread_page"]
