"""The store kit: what helps people who write thread stores (public, stable).

``roder_api.threads`` holds the contract a store implements; this package holds the
pieces every store of this repository is built from, so that a new store need not write
them again:

- :class:`BlockingThreadStore`: the async facade over a blocking driver, with its own
  worker-thread limiter; its blocking calls run on one pool of worker threads shared by
  the whole process (:func:`run_in_worker`, cheaper per call than ``anyio.to_thread``;
  :func:`start_in_worker` from blocking code), the one thread mechanism under the store path;
- :class:`RelationalThreadStore`: a whole SQL store on that facade, specialised by dialect
  (the SQLite and PostgreSQL stores), writing through :class:`WriteBatch` transactions;
- :class:`GroupCommit`: concurrent commits share one blocking write-and-sync;
- :class:`EncodedEvents`: a batch that carries its events' codec bytes, so they are encoded
  once on their way to disk (:func:`payloads_of` takes them, or encodes);
- :class:`FileLeases`: thread leases as OS file locks (released when the holder dies);
- :class:`FollowOn`: events offered to a new thread's create while it runs, journaled in
  the same store call (``BlockingThreadStore.lease_new_thread``'s ``follow_on``);
- :class:`RepairableThreadStore`: what a store implements for ``roder fsck``;
- the fold of a journal into metadata (:func:`fold_metadata`, its open turns
  :func:`open_turns_after` / :func:`turn_change`) and into turns
  (:class:`TurnFold`, :func:`turns_from_events`), the one rule for where
  replay starts (:func:`replay_start`, :func:`last_boundary_sequence`), listing cursors
  and pages, and the argument checks every store shares (:func:`check_expected` for the
  conditional append);
- :class:`StoreSettings`: the ``[thread_store]`` table read key by key, a value of the
  wrong kind an error naming the key (so the runtime adds its file and line).

See ``docs/writing-a-thread-store.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roder_api._exports import lazy_exports
from roder_api._store_waits import (
    TURN_EVENT_TAGS,
    TURN_EVENT_TYPES,
    poll_for_events,
    turn_change,
)
from roder_api._thread_contract import UNSET as UNSET  # its home: roder_api.threads
from roder_api._thread_contract import TurnFold
from roder_api.storekit._blocking import BlockingThreadStore
from roder_api.storekit._checks import (
    check_complete,
    check_consecutive,
    check_continues,
    check_expected,
    metadata_changes,
    validate_expected,
)
from roder_api.storekit._cursors import (
    decode_cursor,
    encode_cursor,
    event_page,
    listing_key,
    thread_page,
)
from roder_api.storekit._encoded import EncodedEvents, payloads_of
from roder_api.storekit._file_leases import FileLeases
from roder_api.storekit._fold import (
    fold_metadata,
    last_boundary_sequence,
    open_turns_after,
    replay_after,
    replay_start,
    turns_from_events,
)
from roder_api.storekit._follow_on import FollowOn
from roder_api.storekit._fork_guard import close_on_fork, forget_on_fork, open_close_on_fork
from roder_api.storekit._group_commit import GroupCommit
from roder_api.storekit._repairable import CheckReport, RepairableThreadStore, RepairReport
from roder_api.storekit._settings import StoreSettings
from roder_api.storekit._workers import WorkerCall, run_in_worker, start_in_worker

if TYPE_CHECKING:  # the SQL stores' pieces, imported on first use (PEP 562 below)
    from roder_api.storekit._open_turns import (
        OPEN_TURNS_DDL,
        PENDING_QUERY,
        backfill_open_turns,
    )
    from roder_api.storekit._relational import RelationalThreadStore
    from roder_api.storekit._write_batch import EventRow, SqlConnection, ThreadRow, WriteBatch

__all__ = [
    "BlockingThreadStore",
    "CheckReport",
    "EncodedEvents",
    "EventRow",
    "FileLeases",
    "FollowOn",
    "GroupCommit",
    "OPEN_TURNS_DDL",
    "PENDING_QUERY",
    "RelationalThreadStore",
    "RepairReport",
    "RepairableThreadStore",
    "SqlConnection",
    "StoreSettings",
    "TURN_EVENT_TAGS",
    "TURN_EVENT_TYPES",
    "ThreadRow",
    "TurnFold",
    "WorkerCall",
    "WriteBatch",
    "backfill_open_turns",
    "check_complete",
    "check_consecutive",
    "check_continues",
    "check_expected",
    "close_on_fork",
    "decode_cursor",
    "encode_cursor",
    "event_page",
    "fold_metadata",
    "forget_on_fork",
    "last_boundary_sequence",
    "listing_key",
    "metadata_changes",
    "open_close_on_fork",
    "open_turns_after",
    "payloads_of",
    "poll_for_events",
    "replay_after",
    "replay_start",
    "run_in_worker",
    "start_in_worker",
    "thread_page",
    "turn_change",
    "turns_from_events",
    "validate_expected",
]

# A file-based store (JSONL) never needs the SQL pieces: they are imported when first used.
_LAZY = {
    "OPEN_TURNS_DDL": "roder_api.storekit._open_turns",
    "PENDING_QUERY": "roder_api.storekit._open_turns",
    "backfill_open_turns": "roder_api.storekit._open_turns",
    "RelationalThreadStore": "roder_api.storekit._relational",
    "EventRow": "roder_api.storekit._write_batch",
    "SqlConnection": "roder_api.storekit._write_batch",
    "ThreadRow": "roder_api.storekit._write_batch",
    "WriteBatch": "roder_api.storekit._write_batch",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
