"""The argument checks every store shares: metadata changes, imports, conditional appends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roder_api._thread_contract import UNSET
from roder_api.errors import SequenceConflictError, StoreCorruptedError
from roder_api.events import JournalEvent


def metadata_changes(title: Any = UNSET, extra: Any = UNSET) -> dict[str, Any]:
    """Return the metadata changes an ``update_thread`` call asks for (``title``, ``extra``).

    Arguments left ``UNSET`` are not included; an empty result means "change nothing".
    """
    changes: dict[str, Any] = {}
    if title is not UNSET:
        changes["title"] = title
    if extra is not UNSET:
        changes["extra"] = dict(extra)
    return changes


def check_consecutive(thread_id: str, entries: Sequence[JournalEvent]) -> None:
    """Raise ``SequenceConflictError`` unless ``entries`` have consecutive sequence numbers."""
    for previous, entry in zip(entries, entries[1:], strict=False):
        if entry.sequence != previous.sequence + 1:
            raise SequenceConflictError(thread_id, previous.sequence + 1, entry.sequence)


def check_continues(thread_id: str, entries: Sequence[JournalEvent], last_sequence: int) -> None:
    """Raise the import's ``SequenceConflictError`` unless ``entries`` follow ``last_sequence``."""
    if entries and entries[0].sequence != last_sequence + 1:
        raise SequenceConflictError(thread_id, last_sequence + 1, entries[0].sequence)


def check_complete(thread_id: str, entries: Sequence[JournalEvent], first: int, last: int) -> None:
    """Raise ``StoreCorruptedError`` unless ``entries`` are exactly sequences first..last.

    What a read of a sorted, unique sequence column must return: a missing sequence (a row
    deleted behind the store's back) is damage, named by thread and sequence, never a
    silently shorter answer. O(1) when the answer is whole (sorted and unique, the ends and
    the count decide).
    """
    count = max(0, last - first + 1)
    if len(entries) == count and (
        not entries or (entries[0].sequence == first and entries[-1].sequence == last)
    ):
        return
    missing = first
    for entry in entries:
        if entry.sequence != missing:
            break
        missing += 1
    if missing > last:
        what = f"it holds events after sequence {last}, the thread's last"
    else:
        what = f"the event at sequence {missing} is missing"
    raise StoreCorruptedError(
        f"thread {thread_id!r} is damaged: {what} (a read of sequences {first}..{last}); "
        "nothing was changed",
        thread_id=thread_id,
        sequence=missing,
    )


def validate_expected(expected_last_sequence: object) -> int | None:
    """Return ``expected_last_sequence`` when it is None or an int >= 0; else ValueError."""
    if expected_last_sequence is None:
        return None
    if (
        not isinstance(expected_last_sequence, int)
        or isinstance(expected_last_sequence, bool)
        or expected_last_sequence < 0
    ):
        raise ValueError(
            f"expected_last_sequence must be None or an integer >= 0, "
            f"not {expected_last_sequence!r}"
        )
    return expected_last_sequence


def check_expected(thread_id: str, expected_last_sequence: int | None, actual: int) -> None:
    """Raise the conditional append's ``SequenceConflictError`` when ``actual`` is not expected.

    ``actual`` is the thread's real last sequence, read inside the store's write step;
    ``expected_last_sequence`` None means "append unconditionally" (never raises).
    """
    if expected_last_sequence is not None and expected_last_sequence != actual:
        raise SequenceConflictError.conditional(thread_id, expected_last_sequence, actual)


__all__ = [
    "check_complete",
    "check_consecutive",
    "check_continues",
    "check_expected",
    "metadata_changes",
    "validate_expected",
]
