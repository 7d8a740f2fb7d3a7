"""A compaction commits conditionally on the sequence it last saw; the typed vocabulary."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from roder_api.codec import dumps, loads
from roder_api.errors import BusyError, CompactionPreempted, RecorderError, RecorderFullError
from roder_api.events import (
    AbortReason,
    CompactionCommitted,
    CompactionDiscarded,
    CompactionMode,
    DiscardReason,
    InputAccepted,
    TurnAborted,
    UsagePurpose,
    UsageUpdated,
    WarningEvent,
)
from roder_api.inference import Completed, TokenUsage
from roder_api.testing import Delay, ScriptedEngine
from roder_api.transcript import UserMessage
from roder_runtime.session._recorder import EventRecorder

from .conftest import make_runtime
from .test_compaction import BOUNDARY, ORIGINAL, USAGE, journal, seed, signalling

pytestmark = pytest.mark.anyio


async def test_items_added_meanwhile_discard_the_candidate_as_a_conflict(tmp_path: Path) -> None:
    opened = anyio.Event()
    engine = ScriptedEngine(
        compactions=signalling([BOUNDARY, USAGE, Delay(0.3), Completed()], opened)
    )
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = await seed(runtime)

        async def write_meanwhile() -> None:
            await opened.wait()
            await runtime.persist_turn_item(thread_id, "t5", UserMessage("wait!"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_meanwhile)
                with pytest.raises(CompactionPreempted) as caught:
                    await runtime.compact_with_provider(
                        thread_id, "t9", "scripted", "scripted-1", ORIGINAL
                    )
        assert caught.value.reason == "conflict"
        events = await journal(runtime, thread_id)
        assert events[-1] == CompactionDiscarded("conflict", "t9")
        assert await runtime.replay_history(thread_id) == [*ORIGINAL, UserMessage("wait!")]


async def test_events_that_are_not_items_do_not_stop_the_commit(tmp_path: Path) -> None:
    opened = anyio.Event()
    engine = ScriptedEngine(
        compactions=signalling([BOUNDARY, USAGE, Delay(0.3), Completed()], opened)
    )
    async with make_runtime(tmp_path / "threads", engine) as runtime:
        thread_id = await seed(runtime)

        async def write_meanwhile() -> None:
            await opened.wait()
            await runtime.append_events(
                thread_id,
                [WarningEvent("a note from a script"), InputAccepted("turn_x", "queued")],
            )

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_meanwhile)
                result = await runtime.compact_with_provider(
                    thread_id, "t9", "scripted", "scripted-1", ORIGINAL
                )
        assert result.boundary == BOUNDARY
        events = await journal(runtime, thread_id)
        assert events[-1] == CompactionCommitted("t9", "native")
        assert WarningEvent("a note from a script") in events
        assert await runtime.replay_history(thread_id) == [BOUNDARY]


def test_the_vocabulary_is_str_enums_with_the_words_on_disk() -> None:
    assert [r.value for r in DiscardReason] == [
        "disconnected",
        "failed",
        "conflicting_boundary",
        "tool_call",
        "no_boundary",
        "not_completed",
        "preempted",
        "conflict",
        "interrupted",
        "too_large",
    ]
    assert [p.value for p in UsagePurpose] == ["turn", "compaction", "discarded_compaction"]
    assert [m.value for m in CompactionMode] == ["native", "summary"]
    assert {"interrupted", "failed", "closed", "process_exited", "timeout"} <= {
        r.value for r in AbortReason
    }
    assert str(DiscardReason.CONFLICT) == "conflict" and f"{AbortReason.CLOSED}" == "closed"
    # On disk the words are what they were; read back, they equal the enums.
    usage = TokenUsage(1, 2, 3)
    typed = UsageUpdated("t", usage, UsagePurpose.DISCARDED_COMPACTION)
    assert dumps(typed) == dumps(UsageUpdated("t", usage, "discarded_compaction"))
    assert loads(dumps(TurnAborted("t", AbortReason.TIMEOUT))) == TurnAborted("t", "timeout")
    assert {UsagePurpose.TURN: 1}.get("turn") == 1


async def test_a_full_recorder_raises_its_own_error_class() -> None:
    async def append(events: object, *, expected_last_sequence: int | None = None) -> list[object]:
        raise AssertionError("never persisted in this test")

    recorder = EventRecorder(append, event_capacity=1, byte_budget=1 << 20)  # type: ignore[arg-type]
    recorder.record(WarningEvent("one"))
    with pytest.raises(RecorderFullError) as full:
        recorder.record(WarningEvent("two"))
    assert isinstance(full.value, BusyError) and isinstance(full.value, RecorderError)
    assert str(full.value) == "event recorder queue is full"
