"""The conformance kits: pytest base classes that a store or engine plugin runs against itself.

A thread-store plugin subclasses :class:`ThreadStoreConformance` and gives it a factory::

    import pytest
    from roder_api.testing.conformance import ThreadStoreConformance
    from roder_mystore import MyStoreFactory

    class TestMyStore(ThreadStoreConformance):
        @pytest.fixture
        def thread_store_factory(self, tmp_path):
            return MyStoreFactory(tmp_path / "db")   # an empty store for each test

An engine plugin subclasses :class:`InferenceEngineConformance` the same way, overriding the
``inference_engine`` fixture. Every check runs under asyncio and under trio (when trio is
installed). Each check is an ordinary ``async`` method, so a test may also call one directly
(``await ThreadStoreConformance().test_batch_append_is_atomic(store)``): it raises
``AssertionError`` when the store breaks the rule.

This module needs pytest; importing :mod:`roder_api.testing` does not.
"""

from __future__ import annotations

from roder_api.testing._conformance_values import ThreadStoreValueConformance
from roder_api.testing._engine_kit import InferenceEngineConformance
from roder_api.testing._kit_support import (
    BAD_THREAD_IDS,
    event_bytes,
    make_metadata,
    native_boundary,
    new_thread_id,
    unserializable_event,
    usage_event,
    user_item,
)
from roder_api.testing._store_checks_conditional import ConditionalAppendChecks
from roder_api.testing._store_checks_damage import DamageChecks
from roder_api.testing._store_checks_journal import JournalChecks
from roder_api.testing._store_checks_pending import PendingInputChecks
from roder_api.testing._store_checks_processes import ProcessChecks
from roder_api.testing._store_checks_threads import ThreadChecks
from roder_api.testing._store_checks_upgrade import OpenTurnsUpgradeChecks
from roder_api.testing._store_checks_wait import WaitChecks


class ThreadStoreConformance(
    JournalChecks,
    ThreadChecks,
    ConditionalAppendChecks,
    WaitChecks,
    PendingInputChecks,
    ProcessChecks,
    DamageChecks,
    ThreadStoreValueConformance,
):
    """The thread-store conformance kit: subclass it and override ``thread_store_factory``.

    The factory fixture must return a :class:`~roder_api.threads.ThreadStoreFactory` whose
    stores start empty for each test and whose ``open()`` may be called several times (a
    reopen, or two store objects on the same data at once). Class attributes tune the load
    of the concurrency checks; :meth:`child_process_factory` and :meth:`read_only_factory`
    say how to open the same store in a child process and read-only;
    :meth:`damage_event` how to damage one stored event from outside (the damage checks are
    skipped without it).
    """


__all__ = [
    "BAD_THREAD_IDS",
    "InferenceEngineConformance",
    "OpenTurnsUpgradeChecks",
    "ThreadStoreConformance",
    "event_bytes",
    "make_metadata",
    "native_boundary",
    "new_thread_id",
    "unserializable_event",
    "usage_event",
    "user_item",
]
