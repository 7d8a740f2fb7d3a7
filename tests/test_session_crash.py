"""A process killed with SIGKILL mid-turn: the journal survives whole, the next session
closes the turn it left running and carries on."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from roder_api.events import (
    AssistantContentDelta,
    ContentPhase,
    InputAccepted,
    ItemCompleted,
    TurnAborted,
    TurnComplete,
    TurnStarted,
)
from roder_api.testing import ScriptedEngine
from roder_api.transcript import AssistantMessage, UserMessage
from roder_runtime import UserInput

from .conftest import REPO, make_runtime

pytestmark = pytest.mark.anyio

CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    from roder_api.events import AssistantContentDelta
    from roder_api.inference import MessageDelta
    from roder_api.testing import Hang, ScriptedEngine
    from roder_runtime import UserInput
    from tests.conftest import make_runtime

    async def main(base, thread_id):
        engine = ScriptedEngine(turns=[[MessageDelta("streamed "), MessageDelta("so far"), Hang()]])
        async with make_runtime(base, engine) as runtime:
            async with await runtime.start_session(thread_id) as session:
                turn_id = await session.submit(UserInput("will be cut off"))
                text = ""
                while text != "streamed so far":
                    event = (await session.next_event()).event
                    if isinstance(event, AssistantContentDelta):
                        text += event.delta
                print(turn_id, flush=True)
                await anyio.sleep_forever()

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


async def test_sigkill_mid_turn_then_resume(tmp_path: Path) -> None:
    base = tmp_path / "threads"
    async with make_runtime(base) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
    async with await anyio.open_process(
        [sys.executable, "-c", CHILD, str(base), thread_id], cwd=REPO
    ) as child:
        assert child.stdout is not None
        output = b""
        with anyio.fail_after(60):
            while not output.endswith(b"\n"):
                output += await child.stdout.receive()
        turn_id = output.decode().strip()
        assert turn_id.startswith("turn_")
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL

    engine = ScriptedEngine()
    async with make_runtime(base, engine) as runtime:
        before = (await runtime.event_page(thread_id, before=None, limit=1000)).events
        assert [e.sequence for e in before] == list(range(1, len(before) + 1))
        assert before[0].event == TurnStarted(turn_id)
        streamed = "".join(
            e.event.delta for e in before if isinstance(e.event, AssistantContentDelta)
        )
        assert streamed == "streamed so far"
        assert not any(isinstance(e.event, (TurnComplete, TurnAborted)) for e in before)

        async with await runtime.start_session(thread_id) as session:
            with anyio.fail_after(20):
                # The crash rule keeps what the user saw, as an interrupt does.
                first = await session.next_event()
                assert first.event == ItemCompleted(
                    turn_id, AssistantMessage("streamed so far", interrupted=True)
                )
                assert first.sequence == len(before) + 1
                second = await session.next_event()
                assert second.event == TurnAborted(turn_id, "process_exited")
                next_turn = await session.submit(UserInput("I am back"))
                assert next_turn is not None
                while True:
                    event = (await session.next_event()).event
                    if isinstance(event, TurnComplete):
                        break
            assert event == TurnComplete(next_turn, "You said: I am back")

        after = (await runtime.event_page(thread_id, before=None, limit=1000)).events
        assert after[: len(before)] == before
        assert [e.sequence for e in after] == list(range(1, len(after) + 1))
        assert ItemCompleted(turn_id, UserMessage("will be cut off")) in [e.event for e in after]
        # The next model request: the partial reply between the two user messages.
        assert list(engine.requests[0][1].transcript) == [
            UserMessage("will be cut off"),
            AssistantMessage("streamed so far", interrupted=True),
            UserMessage("I am back"),
        ]
        assert (await runtime.replay_history(thread_id))[:2] == [
            UserMessage("will be cut off"),
            AssistantMessage("streamed so far", interrupted=True),
        ]


async def test_input_queued_before_the_dead_turn_started_is_answered(tmp_path: Path) -> None:
    """t1 and t2 were accepted while t0 ran (queued), t0 completed, t1 started and its
    process died: the next session closes t1 by the crash rules and runs t2, whose
    acceptance lies before t1's start (and 150 events back)."""
    base = tmp_path / "threads"
    async with make_runtime(base) as runtime:
        thread_id = (await runtime.create_thread()).thread_id
        store = await runtime.store()
        await store.append_events(
            thread_id, [TurnStarted("t0"), ItemCompleted("t0", UserMessage("zero"))]
        )
        await store.append_events(
            thread_id, [InputAccepted("t1", "one"), InputAccepted("t2", "two")]
        )
        deltas = [
            AssistantContentDelta("t0", "s0", ContentPhase.FINAL_ANSWER, f" w{i}")
            for i in range(150)
        ]
        await store.append_events(thread_id, deltas)
        await store.append_events(
            thread_id,
            [ItemCompleted("t0", AssistantMessage("done")), TurnComplete("t0", "done")],
        )
        await store.append_events(
            thread_id, [TurnStarted("t1"), ItemCompleted("t1", UserMessage("one"))]
        )
        assert (await store.get_thread(thread_id)).open_turns == ("t1", "t2")
        async with await runtime.start_session(thread_id) as session:
            seen = []
            with anyio.fail_after(20):
                while not seen or seen[-1] != TurnComplete("t2", "You said: two"):
                    seen.append((await session.next_event()).event)
        assert TurnAborted("t1", "process_exited") in seen
        assert seen.index(TurnAborted("t1", "process_exited")) < seen.index(TurnStarted("t2"))
        assert (await store.get_thread(thread_id)).open_turns == ()
