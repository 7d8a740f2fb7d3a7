"""A child for the tool crash trials: an agent loop that runs tools until it is killed.

    python tool_child.py STORE_DIR WORK_DIR THREAD_ID [--finish]

Opens a session on THREAD_ID (a JSONL store with fsync durability in STORE_DIR; resuming
a turn a killed child left in a tool step), then runs turns forever: each turn makes
``STEPS`` tool steps of two calls — ``note`` (not idempotent) and ``probe`` (idempotent) —
then answers. Every time a tool body runs it appends ``<name> <call id>`` to
``WORK_DIR/runs.log`` (fsynced, before it returns), so the parent can count how often each
call really ran. The engine appends to ``WORK_DIR/bad_replay.log`` each request whose
transcript holds a tool call without its result. With ``--finish`` the child only finishes
what a killed child left (the resumed turn) and exits 0.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from roder_api import ExtensionRegistryBuilder  # noqa: E402 - after the path setup
from roder_api.events import TurnAborted, TurnComplete  # noqa: E402
from roder_api.inference import AgentInferenceRequest, InferenceTurnContext  # noqa: E402
from roder_api.testing import ScriptedEngine, ScriptStep, default_reply, tool_call  # noqa: E402
from roder_api.tools import ToolContext, tool  # noqa: E402
from roder_api.transcript import ToolCallRecord, ToolResultRecord, UserMessage  # noqa: E402
from roder_jsonl_thread_store import JsonlThreadStoreFactory  # noqa: E402
from roder_runtime import Runtime, RuntimeConfig, UserInput  # noqa: E402

STEPS = 3
"""Tool steps per turn."""


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build(store: Path, work: Path) -> Runtime:
    """Return the runtime: the scripted agent, two tools that log their runs, JSONL fsync."""
    runs = work / "runs.log"

    @tool
    async def note(text: str, ctx: ToolContext) -> str:
        """Write a note (running it twice writes it twice)."""
        await anyio.to_thread.run_sync(_append_line, runs, f"note {ctx.call_id}")
        await anyio.sleep(random.uniform(0.0, 0.04))
        return f"noted {text}"

    @tool(idempotent=True)
    async def probe(key: str, ctx: ToolContext) -> str:
        """Read a value (safe to run again)."""
        await anyio.sleep(random.uniform(0.0, 0.03))
        await anyio.to_thread.run_sync(_append_line, runs, f"probe {ctx.call_id}")
        return f"value of {key}"

    def script(
        ctx: InferenceTurnContext, request: AgentInferenceRequest, index: int
    ) -> list[ScriptStep]:
        calls = [i for i in request.transcript if isinstance(i, ToolCallRecord)]
        answered = {i.id for i in request.transcript if isinstance(i, ToolResultRecord)}
        if any(c.id not in answered for c in calls):
            _append_line(work / "bad_replay.log", f"{ctx.turn_id} {index}")
        since_user = 0
        for item in reversed(request.transcript):
            if isinstance(item, UserMessage):
                break
            if isinstance(item, ToolResultRecord):
                since_user += 1
        step = since_user // 2
        if step >= STEPS:
            return default_reply(request)
        tag = f"{ctx.turn_id}_{step}"
        return [
            tool_call("note", {"text": tag}, id=f"n_{tag}"),
            tool_call("probe", {"key": tag}, id=f"p_{tag}"),
            *default_reply(request)[-2:],  # usage and Completed
        ]

    builder = ExtensionRegistryBuilder().inference_engine(ScriptedEngine(turns=script))
    builder.tool(note).tool(probe)
    builder.thread_store_factory(JsonlThreadStoreFactory(base_path=store, durability="fsync"))
    return Runtime(builder.build(), RuntimeConfig())


async def main(store: Path, work: Path, thread_id: str, finish: bool) -> None:
    """Run the child (see the module docstring)."""
    runtime = build(store, work)
    try:
        try:
            await runtime.get_thread(thread_id)
        except LookupError:
            await runtime.create_thread(thread_id=thread_id)
        async with runtime.start_session(thread_id) as session:
            print("ready", flush=True)
            if finish:
                # Until the resumed turn ends, or all is quiet with no turn running.
                while True:
                    with anyio.move_on_after(2) as quiet:
                        event = (await session.next_event()).event
                        if isinstance(event, (TurnComplete, TurnAborted)):
                            return
                    if quiet.cancelled_caught and session.running_turn_id is None:
                        return
            number = 0
            while True:
                number += 1
                turn_id = await session.submit(UserInput(f"work {number}"))
                with anyio.fail_after(60):
                    while True:
                        event = (await session.next_event()).event
                        if isinstance(event, (TurnComplete, TurnAborted)) and (
                            event.turn_id == turn_id
                        ):
                            break
    finally:
        await runtime.aclose()


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], "--finish" in sys.argv[4:])
