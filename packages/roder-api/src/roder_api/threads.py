"""Threads: metadata, snapshots, pages, and the ``ThreadStore`` / ``ThreadStoreFactory`` bases.

A thread is an append-only, per-thread, sequenced journal of events. This module is the
public home of the contract a store implements (defined in ``roder_api._thread_contract``,
so that the store kit can import it without importing this module). What helps a store
*author* (the blocking-driver facade, the fold of a journal into metadata, cursors, group
commit, leases) is in :mod:`roder_api.storekit`, their one home; the names that lived here
before (``fold_metadata``, ``BlockingThreadStore``, ``encode_cursor``, ...) still import
from here, as aliases left out of ``__all__``. ``UNSET`` (the marker of an argument not
given, in the contract's signatures) is at home here.
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
    LeasedThread,
    LeaseHolder,
    ThreadLease,
    ThreadMetadata,
    ThreadPage,
    ThreadSnapshot,
    ThreadStore,
    ThreadStoreFactory,
    Turn,
    validate_thread_id,
)
from roder_api.events import JournalEvent as JournalEvent
from roder_api.inference import TokenUsage as TokenUsage

# The store kit's names that lived here before, still importable from here (their home,
# where they are listed and documented, is roder_api.storekit).
from roder_api.storekit import BlockingThreadStore as BlockingThreadStore
from roder_api.storekit import TurnFold as TurnFold
from roder_api.storekit import check_consecutive as check_consecutive
from roder_api.storekit import check_expected as check_expected
from roder_api.storekit import decode_cursor as decode_cursor
from roder_api.storekit import encode_cursor as encode_cursor
from roder_api.storekit import fold_metadata as fold_metadata
from roder_api.storekit import last_boundary_sequence as last_boundary_sequence
from roder_api.storekit import listing_key as listing_key
from roder_api.storekit import metadata_changes as metadata_changes
from roder_api.storekit import replay_start as replay_start
from roder_api.storekit import turns_from_events as turns_from_events
from roder_api.storekit import validate_expected as validate_expected
from roder_api.transcript import TranscriptItem as TranscriptItem

__all__ = [
    "EventPage",
    "LeaseHolder",
    "LeasedThread",
    "THREAD_ID_PATTERN",
    "ThreadLease",
    "ThreadMetadata",
    "ThreadPage",
    "ThreadSnapshot",
    "ThreadStore",
    "ThreadStoreFactory",
    "Turn",
    "UNSET",
    "validate_thread_id",
]
