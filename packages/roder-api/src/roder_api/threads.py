"""Threads: metadata, snapshots, pages, and the ``ThreadStore`` / ``ThreadStoreFactory`` bases.

A thread is an append-only, per-thread, sequenced journal of events. This module is the
public home of the contract a store implements (defined in ``roder_api._thread_contract``,
so that the store kit can import it without importing this module). What helps a store
*author* (the blocking-driver facade, the fold of a journal into metadata, cursors, group
commit, leases) is in :mod:`roder_api.storekit`; the names that lived here before
(``fold_metadata``, ``BlockingThreadStore``, ``encode_cursor``, ...) are re-exported here.
"""

from __future__ import annotations

# The names the records' annotations use: the records' ``__module__`` is this module, so
# ``typing.get_type_hints`` looks them up here.
from collections.abc import Mapping as Mapping
from typing import Any as Any

from roder_api._thread_contract import (
    THREAD_ID_PATTERN,
    UNSET,
    EventPage,
    LeaseHolder,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    ThreadStore,
    ThreadStoreFactory,
    Turn,
    TurnFold,
    validate_thread_id,
)
from roder_api.events import JournalEvent as JournalEvent
from roder_api.inference import TokenUsage as TokenUsage
from roder_api.storekit import (
    BlockingThreadStore,
    check_consecutive,
    check_expected,
    decode_cursor,
    encode_cursor,
    fold_metadata,
    last_boundary_sequence,
    listing_key,
    metadata_changes,
    replay_start,
    turns_from_events,
    validate_expected,
)
from roder_api.transcript import TranscriptItem as TranscriptItem

__all__ = [
    "BlockingThreadStore",
    "EventPage",
    "LeaseHolder",
    "THREAD_ID_PATTERN",
    "ThreadLease",
    "ThreadMetadata",
    "ThreadPage",
    "ThreadSnapshot",
    "ThreadStore",
    "ThreadStoreFactory",
    "Turn",
    "TurnFold",
    "UNSET",
    "check_consecutive",
    "check_expected",
    "decode_cursor",
    "encode_cursor",
    "fold_metadata",
    "last_boundary_sequence",
    "listing_key",
    "metadata_changes",
    "replay_start",
    "turns_from_events",
    "validate_expected",
    "validate_thread_id",
]
