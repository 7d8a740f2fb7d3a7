"""Open turns as a relational store keeps them: a column, its index, the query, the backfill.

``ThreadMetadata.open_turns`` is folded on every append (:func:`fold_metadata`); a
relational store also writes its length to the ``open_turns`` column of ``roder_threads``,
indexed only where it is above zero, so ``threads_with_pending_input`` is one indexed
query. A store whose schema predates the column adds it with :data:`OPEN_TURNS_DDL` and
fills it once with :func:`backfill_open_turns` (the dialects' migrations do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from roder_api._store_waits import TURN_EVENT_TAGS, open_turns_after
from roder_api.codec import dumps, journal_events, loads
from roder_api.storekit._write_batch import SqlConnection

OPEN_TURNS_DDL: tuple[str, ...] = (
    "ALTER TABLE roder_threads ADD COLUMN open_turns INTEGER NOT NULL DEFAULT 0",
    # Partial: only the threads with an open turn are in it (a handful), whatever the store's
    # size; the query's ``open_turns > 0`` lets SQLite and PostgreSQL use it.
    "CREATE INDEX roder_threads_open ON roder_threads (updated_at_ms, thread_id) "
    "WHERE open_turns > 0",
)
"""The statements that add the ``open_turns`` column and its index to ``roder_threads``."""

PENDING_QUERY = (
    "SELECT thread_id FROM roder_threads WHERE open_turns > 0 AND updated_at_ms >= ? "
    "ORDER BY updated_at_ms DESC, thread_id DESC LIMIT ?"
)
"""The threads with an open turn, newest update first (``?`` placeholders)."""

_TURN_EVENTS = (
    "SELECT sequence, recorded_at_ms, event FROM roder_events WHERE thread_id = ? AND ("
    + " OR ".join("CAST(event AS TEXT) LIKE ?" for _ in TURN_EVENT_TAGS)
    + ") ORDER BY sequence"
)
# A superset: a tag quoted inside a message matches too; the decoded events decide. (CAST:
# SQLite compares no BLOB with a text pattern.)
_TURN_PATTERNS = tuple(f'%"{tag}"%' for tag in sorted(TURN_EVENT_TAGS))


def backfill_open_turns(
    conn: SqlConnection,
    *,
    sql: Callable[[str], str] = lambda text: text,
    encode_payload: Callable[[bytes], Any] = lambda payload: payload,
) -> int:
    """Fold the open turns of every thread into its metadata and ``open_turns`` column, in
    the caller's transaction; return how many threads have an open turn.

    Run once, when a migration adds the column: only the events that open or end a turn
    are read and decoded. ``sql`` turns ``?`` placeholders into the dialect's;
    ``encode_payload`` turns the codec's bytes into what the metadata column stores.
    """
    threads = conn.execute(
        "SELECT thread_id, metadata FROM roder_threads WHERE last_sequence > 0"
    ).fetchall()
    events_query = sql(_TURN_EVENTS)
    update = sql("UPDATE roder_threads SET open_turns = ?, metadata = ? WHERE thread_id = ?")
    pending = 0
    for thread_id, raw in threads:
        rows = conn.execute(events_query, (thread_id, *_TURN_PATTERNS)).fetchall()
        opened = open_turns_after((), journal_events(rows, thread_id=thread_id))
        metadata = loads(raw)
        if opened != metadata.open_turns:
            metadata = replace(metadata, open_turns=opened)
            conn.execute(update, (len(opened), encode_payload(dumps(metadata)), thread_id))
        pending += bool(opened)
    return pending


__all__ = ["OPEN_TURNS_DDL", "PENDING_QUERY", "backfill_open_turns"]
