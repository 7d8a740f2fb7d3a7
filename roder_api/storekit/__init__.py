"""The store kit: what helps people who write thread stores (public, stable).

``roder_api.threads`` holds the contract a store implements; this package holds the
pieces every store of this repository is built from, so that a new store need not write
them again:

- :class:`BlockingThreadStore`: the async facade over a blocking driver;
- :class:`GroupCommit`: concurrent commits share one blocking write-and-sync;
- :class:`FileLeases`: thread leases as OS file locks (released when the holder dies);
- the metadata fold, the "replay starts here" rule, the listing-cursor helpers and the
  argument checks shared by every store (the conditional append's :func:`check_expected`).

See ``docs/writing-a-thread-store.md``.
"""

from __future__ import annotations

from roder_api.storekit._file_leases import FileLeases
from roder_api.storekit._group_commit import GroupCommit
from roder_api.threads import (
    UNSET,
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

__all__ = [
    "BlockingThreadStore",
    "FileLeases",
    "GroupCommit",
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
]
